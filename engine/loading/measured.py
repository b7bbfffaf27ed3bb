"""Figures measured once per machine and model, kept in the cache folder as JSON: the dtype choice
(auto_dtype.py), llama.cpp's exact kernel classes (runtime/llamacpp.py). Written whole to a
temporary file and renamed, so a reader never sees half of one; the oldest entries go first."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write(path: Path, known: dict, keep: int = 64) -> None:
    """`known` (its `keep` newest entries: dicts keep insertion order) to `path`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(list(known.items())[-keep:]), indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not record a measurement in %s (%s); it will be measured again", path, exc)


def remember(path: Path, key: str, value: dict, keep: int = 64) -> None:
    """Add `key` to the file, read again first: another process may have added one meanwhile."""
    known = read(path)
    known.pop(key, None)
    known[key] = value
    write(path, known, keep)
