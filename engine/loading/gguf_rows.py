"""Single rows of a GGUF file's token matrices, dequantized on demand: what draft heads on the
llama.cpp runtime need of the model (the output layer's rows of the tokens they guess, the root
token's input embedding) without a float32 copy of a 151,936-row matrix.

A quantized matrix is stored row by row, each row a whole number of blocks, so a row dequantizes
alone. The file is memory-mapped: only the rows asked for are read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..protocol import ModelLoadError

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"  # absent where the output layer is tied to the embedding (SmolLM2)
BULK_ROWS = 64  # a read of more rows than this (the heads' output rows, at load) maps the file anew after


class GgufRows:
    def __init__(self, path: Path):
        from .gguf import tensor_infos

        self.path = Path(path)
        tensors = tensor_infos(self.path)
        if EMBEDDING not in tensors:
            raise ModelLoadError(f"{path} has no {EMBEDDING}: draft heads cannot read its token rows")
        self._embedding = _Matrix(self.path, tensors[EMBEDDING])
        self._output = _Matrix(self.path, tensors[OUTPUT]) if OUTPUT in tensors else self._embedding
        self.hidden_size, self.vocab_size = self._embedding.row_length, self._embedding.count
        self._cache: dict[int, np.ndarray] = {}

    def output_rows(self, ids) -> np.ndarray:
        """(len(ids), H) float32: the output layer's rows of `ids`."""
        return self._output.rows(ids)

    def embedding_rows(self, ids) -> np.ndarray:
        """(len(ids), H) float32: the input embeddings of `ids`."""
        return self._embedding.rows(ids)

    def embedding(self, token: int) -> np.ndarray:
        """One token's input embedding, kept: a drafting step asks for the root token's."""
        row = self._cache.get(token)
        if row is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            row = self._cache[token] = self.embedding_rows([token])[0]
        return row


class _Matrix:
    """A 2-D tensor of the file, memory-mapped as (rows, bytes a row)."""

    def __init__(self, path: Path, info):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.kind = GGMLQuantizationType(info.kind)
        self.row_length, self.count = int(info.shape[0]), int(info.shape[1])
        block, block_bytes = GGML_QUANT_SIZES[self.kind]
        shape = (self.count, self.row_length // block * block_bytes)
        self._map = lambda: np.memmap(path, np.uint8, "r", info.start, shape)
        self.data = self._map()

    def rows(self, ids) -> np.ndarray:
        from gguf import dequantize

        raw = np.asarray(self.data[np.asarray(ids, dtype=np.int64)])
        if len(raw) > BULK_ROWS:
            # The pages read stay resident in this mapping (llama.cpp maps the same file for itself):
            # mapped anew, they leave this process's memory (Qwen2.5-Coder's heads: 8,192 rows, 137 MB).
            self.data = self._map()
        return np.ascontiguousarray(dequantize(raw, self.kind), dtype=np.float32).reshape(len(raw), self.row_length)
