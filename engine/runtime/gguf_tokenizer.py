"""A GGUF file's own tokenizer, through llama.cpp: what the engine asks of a tokenizer (encode,
decode, the vocabulary, BOS and EOS, each token's bytes), without transformers. Token ids are the
file's, as llama-server's are.

A file this project exported from a model folder (the embedded model) splits text with the folder's
own tokenizer.json (the `tokenizers` library, no transformers): llama.cpp only knows its built-in
pre-tokenizer regexes, and the nearest one ("gpt-2") cuts `__name__` in four where the model saw one
token, which the model answers with nonsense (export_gguf.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path


class GgufTokenizer:
    def __init__(self, L, vocab, tokenizer_json: Path | None = None):
        self.L, self._vocab = L, vocab
        self._splitter = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer

            self._splitter = Tokenizer.from_file(str(tokenizer_json))
            self._splitter.encode_special_tokens = True  # `<fim_prefix>` written in a file stays text
        self.n_tokens = L.llama_vocab_n_tokens(vocab)
        self.bos_token_id = _token(L.llama_vocab_bos(vocab))
        self.eos_token_id = _token(L.llama_vocab_eos(vocab))
        self.add_bos_token = bool(L.llama_vocab_get_add_bos(vocab))
        self.special_ids = {i for i in range(self.n_tokens)
                            if L.llama_vocab_get_attr(vocab, i) & (L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_UNKNOWN)}
        # every token that ends generation in llama.cpp's own judgement (EOS, EOT, <|endoftext|>, ...)
        self.end_ids = {i for i in range(self.n_tokens) if L.llama_vocab_is_eog(vocab, i)}
        self._vocab_dict: dict[str, int] | None = None
        self._pieces: list[bytes] | None = None

    def __len__(self) -> int:
        return self.n_tokens

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = True) -> list[int]:
        """The text's ids; special tokens written in the text stay text (`<|fim_prefix|>` in a
        user's file is not a FIM token), as split_special_tokens does in transformers."""
        if self._splitter is not None:
            return self._splitter.encode(text, add_special_tokens=add_special_tokens).ids
        data = text.encode("utf-8", "surrogatepass")
        room = len(data) + 8
        out = (self.L.llama_token * room)()
        n = self.L.llama_tokenize(self._vocab, data, len(data), out, room, add_special_tokens, not split_special_tokens)
        if n < 0:  # the buffer was short: -n is what it takes
            room = -n
            out = (self.L.llama_token * room)()
            n = self.L.llama_tokenize(self._vocab, data, len(data), out, room, add_special_tokens,
                                      not split_special_tokens)
        return list(out[:n])

    def decode(self, ids: list[int], skip_special_tokens: bool = False, **_) -> str:
        pieces = self.pieces()
        return b"".join(b"" if skip_special_tokens and i in self.special_ids else self._spelled(i, pieces)
                        for i in ids).decode("utf-8", "replace")

    def _spelled(self, token: int, pieces: list[bytes]) -> bytes:
        """What a token writes: its text, a special token's name included (as transformers decodes)."""
        return pieces[token] if token not in self.special_ids else self.token_text(token).encode()

    def token_text(self, token: int) -> str:
        return self.L.llama_vocab_get_text(self._vocab, token).decode("utf-8", "replace")

    def pieces(self) -> list[bytes]:
        """The bytes each token spells (b"" for special tokens): token healing's alphabet."""
        if self._pieces is None:
            buf = ctypes.create_string_buffer(256)
            pieces = []
            for i in range(self.n_tokens):
                if i in self.special_ids:
                    pieces.append(b"")
                    continue
                n = self.L.llama_token_to_piece(self._vocab, i, buf, 256, 0, False)
                pieces.append(buf.raw[:n] if n > 0 else b"")
            self._pieces = pieces
        return self._pieces

    def get_vocab(self) -> dict[str, int]:
        """Token text -> id, as the file spells tokens (special tokens by name: FIM detection reads them)."""
        if self._vocab_dict is None:
            self._vocab_dict = {self.token_text(i): i for i in range(self.n_tokens)}
        return self._vocab_dict


def _token(token: int) -> int | None:
    return token if token >= 0 else None
