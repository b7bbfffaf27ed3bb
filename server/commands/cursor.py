"""FILE:LINE:COL arguments (1-based, as editors show them) and the settings that apply to a file."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigSources, Settings, read_config_file
from ..languages import LANGUAGES_BY_SUFFIX
from ..documents import Document
from .common import MODEL_HELP, CommandError, say


@dataclass
class Cursor:
    path: Path
    line: int  # 1-based
    column: int  # 1-based, in characters


def parse_cursor(spec: str) -> Cursor:
    path, sep1, rest = spec.rpartition(":")
    file, sep2, line = path.rpartition(":")
    if not (sep1 and sep2 and line.isdigit() and rest.isdigit()):
        raise argparse.ArgumentTypeError(f"expected FILE:LINE:COL with 1-based numbers, got {spec!r}")
    if int(line) < 1 or int(rest) < 1:
        raise argparse.ArgumentTypeError(f"LINE and COL are 1-based (as editors show them), got {spec!r}")
    return Cursor(Path(file), int(line), int(rest))


def load_document(cursor: Cursor) -> tuple[Document, int]:
    """The file as a Document, and the cursor as a string offset (clamped to the file)."""
    if not cursor.path.is_file():
        raise CommandError(f"{cursor.path} is not a file")
    raw = cursor.path.read_bytes()
    if b"\x00" in raw[:8192]:
        raise CommandError(f"{cursor.path} looks binary (it has NUL bytes); give a source file")
    text = raw.decode("utf-8", errors="replace")
    doc = Document(cursor.path.resolve().as_uri(), text, LANGUAGES_BY_SUFFIX.get(cursor.path.suffix, ""))
    line_index = cursor.line - 1
    if line_index >= doc.line_count:
        return doc, len(text)
    line = doc.line_text(line_index)
    column = min(cursor.column - 1, len(line))
    return doc, doc.line_starts[line_index] + column


def settings_for(path: Path, overrides: dict) -> Settings:
    """The settings of the nearest folder above `path` with a config file, then `overrides`."""
    sources = ConfigSources()
    for folder in [path.resolve().parent, *path.resolve().parents]:
        values, errors = read_config_file(folder)
        if values or errors:
            for error in errors:
                say(error.message())
            sources.file_values, sources.root = values, folder  # its relative paths are the folder's
            break
    sources.client_values = {k: v for k, v in overrides.items() if v is not None}
    return sources.settings()


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--device", help="auto, cpu, cuda (default: auto)")
    parser.add_argument("--dtype", help="auto, int8, float32, bfloat16, float16 (default: auto)")

