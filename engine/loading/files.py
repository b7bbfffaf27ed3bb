"""Where the engine keeps its files (the cache folder) and a file's digest: shared by the GGUF
loader, the catalog's downloads and the measurements kept per machine."""

from __future__ import annotations

import os
from pathlib import Path

HASH_CHUNK = 16 * 2**20


def cache_root() -> Path:
    """Where dequantized models go: $MEMOSIGHT_CACHE, else $XDG_CACHE_HOME/memosight, else
    ~/.cache/memosight."""
    if os.environ.get("MEMOSIGHT_CACHE"):
        return Path(os.environ["MEMOSIGHT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "memosight"


def digest_of(path: Path, digest):
    """`digest` (a hashlib-style object) fed the whole file, in chunks; its hex digest."""
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    import xxhash

    return digest_of(path, xxhash.xxh3_64())
