"""Rendering chosen units as prompt text: in file order, each run of skipped lines one elision
marker (`# ...`, in the language's comment syntax, indented like what it stands for), other files
under a `file:` header; and the regions that say where each kept line came from."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .packed import Region
from .regions import FileAnalysis


@dataclass
class Source:
    """One file whose units may be chosen: the current document or another open one."""

    path: str
    analysis: FileAnalysis
    scores: list[float]
    rows: tuple[int, int]  # units must lie inside these rows
    comment: str
    closers: tuple[int, ...] = ()  # units kept for their closing rows in range (`}` of enclosing blocks)


def marker(skipped: str, comment: str) -> str:
    """The elision marker for `skipped` lines, indented like the first of them that is not blank."""
    for line in skipped.split("\n"):
        if line.strip():
            indent = line[:len(line) - len(line.lstrip(" \t"))]
            return f"{indent}{comment} ...\n"
    return ""


def header(source: Source, current_path: str) -> str:
    """The line naming `source` above its units, relative to the file being edited."""
    try:
        name = os.path.relpath(source.path, os.path.dirname(current_path))
    except ValueError:
        name = source.path
    return f"{source.comment} file: {name}\n"


def render(sources: list[Source], chosen: list[set[int]], with_headers: bool, trailing: bool,
           gap_before: bool) -> tuple[str, list[Region]]:
    """The chosen units of each source in file order; runs of skipped lines become one marker."""
    out: list[str] = []
    regions: list[Region] = []
    for source, units in zip(sources, chosen):
        low, high = source.rows
        is_current = source is sources[-1]
        if not units and not (is_current and with_headers):
            continue
        if with_headers:
            out.append(header(source, sources[-1].path))
        lines = source.analysis.lines
        rows = sorted({r for u in units for r in source.analysis.units[u].all_rows() if low <= r < high})
        row_unit = {r: u for u in units for r in source.analysis.units[u].all_rows()}
        previous = low - 1
        for r in rows:
            if r > previous + 1:
                gap = lines[previous + 1:r]
                if previous < low and gap_before:
                    pass  # the caller's text already ends with a marker for these lines
                elif any(line.strip() for line in gap):
                    out.append(marker("".join(gap), source.comment) or f"{source.comment} ...\n")
                elif out or low > 0:
                    # blank lines between kept units stay as they are, and so do those right after
                    # the caller's text (the near suffix, before the units below it): a function
                    # running straight into the next `def` is code no model has seen
                    out.extend(gap)
            out.append(lines[r])
            unit = source.analysis.units[row_unit[r]]
            if regions and regions[-1].path == source.path and regions[-1].end_line == r \
                    and regions[-1].kind == unit.kind:
                regions[-1].end_line = r + 1
            else:
                regions.append(Region(source.path, r + 1, r + 1, unit.kind,
                                      round(source.scores[row_unit[r]], 3)))
            previous = r
        if out and not out[-1].endswith("\n"):
            out.append("\n")
        tail = lines[previous + 1:high]
        if (trailing or not is_current) and any(line.strip() for line in tail):
            out.append(marker("".join(tail), source.comment) or f"{source.comment} ...\n")
        elif trailing and out:
            out.extend(tail)
    return "".join(out), regions
