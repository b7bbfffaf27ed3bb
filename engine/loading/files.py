"""Where the engine keeps its files (the cache folder) and a file's digest: shared by the GGUF
loader, the catalog's downloads and the measurements kept per machine."""

from __future__ import annotations

import functools
import os
from pathlib import Path

HASH_CHUNK = 16 * 2**20


def cache_root() -> Path:
    """Where dequantized models go: $MEMOSIGHT_CACHE, else $XDG_CACHE_HOME/memosight, else
    ~/.cache/memosight. Resolved once per value of those variables: the server asks on every
    keystroke whether a catalog model's file is there yet."""
    return _cache_root(os.environ.get("MEMOSIGHT_CACHE"), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_root(memosight_cache: str | None, xdg_cache_home: str | None, home: str | None) -> Path:
    if memosight_cache:
        return Path(memosight_cache).expanduser()
    return Path(xdg_cache_home or Path.home() / ".cache").expanduser() / "memosight"


def digest_of(path: Path, digest):
    """`digest` (a hashlib-style object) fed the whole file, in chunks; its hex digest."""
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_hash(path: Path) -> str:
    import xxhash

    return digest_of(path, xxhash.xxh3_64())
