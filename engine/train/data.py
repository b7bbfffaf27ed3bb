"""The base model's training data: fill-in-the-middle samples packed into fixed-length windows.

Sample formats (StarCoder special tokens; E = <|endoftext|>):
    plain  {code}E
    PSM    <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>{middle}E
    SPM    <fim_prefix><fim_suffix>{suffix}<fim_middle>{prefix}{middle}E
Samples are packed back to back into fixed-length windows; the loss is next-token cross-entropy
on every position. An epoch's windows depend only on (seed, epoch), which is what lets a resumed
run see exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import random

import torch

from .tokenizer import EOS, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX


def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Cut `text` into prefix/middle/suffix at character positions.

    Half the time the middle is a random span (StarCoder); otherwise it starts at a random
    position and runs to the end of its line or a few lines further, as when a cursor sits
    mid-line and the user wants the rest of the line or the next statements."""
    if rng.random() < 0.5:
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    else:
        a = rng.randrange(len(text) + 1)
        b = a
        for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
            nl = text.find("\n", b)
            b = len(text) if nl < 0 else nl + 1
            if rng.random() < 0.5 and b < len(text):  # the middle often excludes the newline
                b -= 1
                break
    return text[:a], text[a:b], text[b:]


def sample_pieces(text: str, rng: random.Random, fim_rate: float, spm_rate: float) -> list[str]:
    """One document as a list of pieces; special tokens are pieces of their own."""
    if rng.random() >= fim_rate:
        return [text, EOS]
    prefix, middle, suffix = fim_split(text, rng)
    if rng.random() < spm_rate:
        # StarCoder SPM: prefix and middle are tokenized as one run, as the model will generate them
        return [FIM_PREFIX, FIM_SUFFIX, suffix, FIM_MIDDLE, prefix + middle, EOS]
    return [FIM_PREFIX, prefix, FIM_SUFFIX, suffix, FIM_MIDDLE, middle, EOS]


def split_into_chunks(text: str, max_chars: int) -> list[str]:
    """Line-aligned pieces of at most ~max_chars, so that a FIM sample fits in one window."""
    if len(text) <= max_chars:
        return [text]
    chunks, start = [], 0
    while start < len(text):
        end = min(len(text), start + max_chars)
        if end < len(text):
            nl = text.rfind("\n", start + max_chars // 2, end)
            end = nl + 1 if nl >= 0 else end
        chunks.append(text[start:end])
        start = end
    return chunks


def encode_pieces(tokenizer, docs: list[list[str]]) -> list[int]:
    """Concatenate the token ids of every document; specials map to their ids directly."""
    specials = {t: tokenizer.convert_tokens_to_ids(t) for t in (EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)}
    plain = [p for doc in docs for p in doc if p not in specials and p]
    encoded = iter(tokenizer(plain, add_special_tokens=False, verbose=False)["input_ids"]) if plain else iter(())
    ids: list[int] = []
    for doc in docs:
        for piece in doc:
            if piece in specials:
                ids.append(specials[piece])
            elif piece:
                ids.extend(next(encoded))
    return ids


def pack_windows(ids: list[int], window: int) -> torch.Tensor:
    """(N, window) non-overlapping windows of the token stream; the ragged tail is dropped."""
    n = len(ids) // window
    return torch.tensor(ids[: n * window], dtype=torch.long).view(n, window)


def epoch_windows(tokenizer, texts: list[str], seq_len: int, seed: int, epoch: int,
                  fim_rate: float, spm_rate: float) -> torch.Tensor:
    """The training windows of one epoch, (N, seq_len + 1); deterministic in (seed, epoch)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    chunks = [c for t in texts for c in split_into_chunks(t, max_chars=int(seq_len * 3.2))]
    rng.shuffle(chunks)
    docs = [sample_pieces(c, rng, fim_rate, spm_rate) for c in chunks]
    return pack_windows(encode_pieces(tokenizer, docs), seq_len + 1)


def eval_windows(tokenizer, texts: list[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """Held-out windows: plain left-to-right documents, in a fixed order, no FIM."""
    windows = pack_windows(encode_pieces(tokenizer, [[t, EOS] for t in texts]), seq_len + 1)
    return spread_sample(windows, max_tokens) if max_tokens else windows


def spread_sample(windows: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """At most max_tokens worth of windows, evenly spaced so that every part of the data counts."""
    n = max(1, max_tokens // windows.shape[1])
    if n >= len(windows):
        return windows
    return windows[torch.linspace(0, len(windows) - 1, n).long()]
