"""Shared pieces of the benchmarks: reading a corpus folder, cutting cursor positions, tables."""

from __future__ import annotations

import random
from pathlib import Path

SOURCE_SUFFIXES = (".py", ".js", ".ts", ".go", ".rs")


def source_files(folder: str | Path, max_files: int | None = None, min_chars: int = 2000) -> list[Path]:
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus folder {str(root)!r} does not exist; give a folder of source files")
    files = sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()
                   and p.stat().st_size >= min_chars)
    if not files:
        raise FileNotFoundError(f"no source files of at least {min_chars} bytes under {root}")
    return files[:max_files] if max_files else files


def cut_points(text: str, count: int, rng: random.Random) -> list[int]:
    """Cursor offsets: half at line starts (after the indentation), half mid-line."""
    lines = text.splitlines(keepends=True)
    starts, offset = [], 0
    for line in lines:
        if line.strip() and offset > 200:
            starts.append(offset + len(line) - len(line.lstrip()))
        offset += len(line)
    points = []
    for i in range(count):
        if not starts:
            break
        start = rng.choice(starts)
        if i % 2:
            line_end = text.find("\n", start)
            line_end = len(text) if line_end == -1 else line_end
            start = rng.randint(start, max(start, line_end - 1))
        points.append(start)
    return points


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain text table: columns are (key, header)."""
    cells = [[h for _, h in columns]] + [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.rjust(w) if n and i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)
