"""Where a model's draft heads are and what their folder holds: the config, the weights' file names,
and a reader of the weights that needs no torch (the llama.cpp runtime's heads run in numpy). Both
the numpy heads (heads.py) and the torch modules (head_layers.py) read their folders through here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "draft_heads.safetensors"
CONFIG_FILE = "draft_heads.json"
PACKAGED_HEADS = Path(__file__).parent.parent / "models" / "heads"  # <model folder name>/draft_heads.*


@dataclass
class HeadsConfig:
    hidden_size: int  # the base model's hidden size
    num_heads: int = 4  # K: head k guesses the token k places after the root
    num_layers: int = 1  # residual blocks per head
    vocab_size: int = 0  # N: an output layer of its own over N frequent tokens; 0: the base model's lm_head
    token_input: bool = False  # the heads see the root token's embedding as well as the hidden state
    inner_size: int = 0  # a block's inner width (x + W2 silu(W1 x)); 0: Medusa's x + silu(W x)


def heads_folder(model_dir: Path | None) -> Path | None:
    """Where a model's heads are: beside it, else among the packaged ones under the model folder's
    name (a GGUF file's dequantized folder is named after the file and its hash, so packaged heads
    match that very file and no other)."""
    if model_dir is None:
        return None
    model_dir = Path(model_dir)
    if (model_dir / CONFIG_FILE).is_file():
        return model_dir
    packaged = PACKAGED_HEADS / model_dir.name.removesuffix("-shards")  # gguf.dequantized_folder's name
    return packaged if (packaged / CONFIG_FILE).is_file() else None


def gguf_heads_folder(path: Path) -> Path | None:
    """Where the heads of a GGUF file on the llama.cpp runtime are (trained on that runtime's hidden
    states): those `memosight train heads --runtime llamacpp` wrote into the cache, else the
    packaged ones, under the file's name and hash (no other file picks them up)."""
    from ..loading.files import cache_root, file_hash

    name = f"{path.stem}-{file_hash(path)}"
    for folder in (cache_root() / "heads" / "llamacpp" / name, PACKAGED_HEADS / "llamacpp" / name):
        if (folder / CONFIG_FILE).is_file():
            return folder
    return None


SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file as numpy arrays, floats as float32 (safetensors' own numpy reader has no
    bfloat16, the heads' saved dtype): the format is a length, a JSON header, the raw data."""
    data = Path(path).read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name} is {info['dtype']}, which these heads do not use")
        dtype = np.dtype(SAFETENSORS_DTYPES[info["dtype"]])
        raw = np.frombuffer(data, dtype, (end - begin) // dtype.itemsize, 8 + length + begin).reshape(info["shape"])
        if info["dtype"] == "BF16":  # the top half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.astype(np.float32) if raw.dtype.kind == "f" else raw.copy()
    return out
