"""Token healing: the prompt ends at a token boundary, and the first tokens generated spell the
text that was cut off.

A prompt that ends at the cursor often ends inside what the model writes as one token: tokenizers
join a newline with the indentation after it, and a space with the next word. Prompted with
`...\\n` + 12 spaces, a model that has only ever seen `\\n` + 11 spaces followed by ` return` goes
wrong at once (an extra space, or nothing). So the prompt backs up to the last token boundary
before the cursor, and generation is constrained until it has spelled the removed text: a token is
allowed when its bytes start with the text still to spell (it spells the rest and goes on), or
when its bytes are a prefix of that text (it spells part of it, and the constraint goes on). Only
the first kind alone would be wrong for GPT-2-style pre-tokenizers, which split a whitespace run
before a word. Among the allowed tokens the choice is greedy, so decoding stays exactly greedy
given the constraint; the suggestion is what the tokens spell after the removed text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

MAX_BACKUP_TOKENS = 8  # a long indentation in small pieces; each one is a constrained (plain) step


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the prompt, backed up to a token boundary before the cursor
    healed: str = ""  # the text between that boundary and the cursor: generation spells it first


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TokenBytes:
    """The bytes each token spells, indexed for the two questions healing asks."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces  # per token id; b"" for special tokens, which spell no text
        # the ids by their bytes (ties by id) and the bytes in that order: one sort, no index of pieces
        # (Qwen2.5-Coder's 151,936 tokens: 0.85 s with a dict of pieces and a sort of pairs, on the
        # first healed prompt after spawn)
        self._ids = sorted((i for i, p in enumerate(pieces) if p), key=pieces.__getitem__)
        self._sorted = [pieces[i] for i in self._ids]

    @classmethod
    def of(cls, tokenizer) -> TokenBytes:
        if hasattr(tokenizer, "pieces"):  # a GGUF file's tokenizer says its tokens' bytes itself
            return cls(tokenizer.pieces())
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        decoder = type(tokenizer.backend_tokenizer.decoder).__name__ if hasattr(tokenizer, "backend_tokenizer") else ""
        if decoder == "ByteLevel":
            table = _byte_decoder()
            spell = lambda t: bytes(table[c] for c in t) if all(c in table for c in t) else t.encode()  # noqa: E731
        else:  # SentencePiece style: ▁ is a space, <0xNN> a raw byte
            def spell(t: str) -> bytes:
                m = _BYTE_FALLBACK.match(t)
                return bytes([int(m.group(1), 16)]) if m else t.replace("▁", " ").encode()
        return cls([b"" if i in special or t is None else spell(t) for i, t in enumerate(tokens)])

    def allowed(self, rest: bytes) -> list[int]:
        """Token ids that may come next while `rest` is still to be spelled, in id order (so that
        the greedy choice among them breaks ties as an unconstrained argmax does)."""
        low = bisect.bisect_left(self._sorted, rest)
        high = bisect.bisect_left(self._sorted, _successor(rest)) if _successor(rest) else len(self._sorted)
        ids = self._ids[low:high]  # sorted bytes: those starting with `rest` are together
        for end in range(1, len(rest)):  # those spelling a part of it: the same bytes, side by side
            at = bisect.bisect_left(self._sorted, rest[:end])
            while at < len(self._sorted) and self._sorted[at] == rest[:end]:
                ids.append(self._ids[at])
                at += 1
        return sorted(ids)

    def rest_after(self, rest: bytes, token: int) -> bytes:
        """What is left to spell after `token` (empty once it is spelled)."""
        piece = self.pieces[token]
        return b"" if piece.startswith(rest) else rest[len(piece):]


def _successor(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with `prefix` (b"" if none)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else b""


def last_word_chars(tokenizer, text: str, window: int = 128) -> int:
    """How many characters at the end of `text` form its last pre-token (the unit the tokenizer
    splits text into before merging bytes: a word with its leading space, a whitespace run). Typing
    more can change how that unit splits (`"\n" + 12 spaces` becomes `"\n" + 11 spaces` and
    `" return"`), but not the units before it. 0 where the tokenizer has no pre-tokenizer."""
    pre = getattr(getattr(tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
    if not text:
        return 0
    tail = text[-window:]
    if pre is None:  # no pre-tokenizer to ask (a GGUF file's tokenizer): the last word, as BPE's split it
        match = _LAST_WORD.search(tail)
        return len(match.group()) if match else 0
    words = pre.pre_tokenize_str(tail)
    return len(tail) - words[-1][1][0] if words else 0


# A word with its leading space, a run of other symbols, or whitespace: the units GPT-2-style
# pre-tokenizers split text into, seen from the end of the text.
_LAST_WORD = re.compile(r"(?: ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+)$")


def back_up(prefix_ids: list[int], pieces: TokenBytes, min_chars: int = 0) -> tuple[list[int], str]:
    """The prefix's tokens without the last one, or as many more as it takes to cut at least
    `min_chars` characters (the last pre-token) and to end on a character boundary; and the text
    they spelled. Never backs up over a special token or more than MAX_BACKUP_TOKENS tokens."""
    best: tuple[list[int], str] = (prefix_ids, "")
    for n in range(1, min(MAX_BACKUP_TOKENS, len(prefix_ids)) + 1):
        if not pieces.pieces[prefix_ids[-n]]:
            break
        try:
            healed = b"".join(pieces.pieces[i] for i in prefix_ids[-n:]).decode("utf-8")
        except UnicodeDecodeError:
            continue
        best = (prefix_ids[:-n], healed)
        if len(healed) >= min_chars:
            break
    return best
