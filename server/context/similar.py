"""Code like the code being written (RepoCoder's retrieval, Copilot's neighbouring tabs): the units
of this file and of the other open files whose identifiers resemble the lines above the cursor.

Similarity is the Jaccard index of identifier sets, cheap enough to score every unit of a few open
files when the far part is chosen (not on every keystroke: the far part is cached). The score joins
the unit's others (regions.py), so a similar chunk is packed like any other region: with the
signatures that show where it sits, in file order, which keeps the prompt's head stable.
"""

from __future__ import annotations

from ..caching import LRU
from .regions import STOP_WORDS, FileAnalysis, identifiers

QUERY_LINES = 6  # the lines above the cursor that say what is being written
MIN_SIMILARITY = 0.15  # below this, shared names are the common ones of the file (`self`, `value`)
# Names too common in code to say two pieces are alike.
COMMON = STOP_WORDS | frozenset({"self", "cls", "args", "kwargs", "print", "len", "str", "int", "range", "list",
                                 "dict", "isinstance", "elif", "try", "except", "raise", "with", "pass",
                                 "lambda", "yield", "async", "await", "break", "continue"})

_unit_names = LRU(16)  # id of a FileAnalysis -> (the analysis, each unit's identifier set)


def query_names(lines_above: str) -> frozenset[str]:
    """The identifiers that describe the code being written: those of the last QUERY_LINES lines."""
    lines = [line for line in lines_above.split("\n") if line.strip()][-QUERY_LINES:]
    return frozenset(identifiers("\n".join(lines)) - COMMON)


def unit_names(analysis: FileAnalysis) -> list[frozenset[str]]:
    """Each unit's identifiers, computed once per analysis (analyses are cached by content)."""
    cached = _unit_names.get(id(analysis))
    if cached is not None and cached[0] is analysis:
        return cached[1]
    names = [frozenset(identifiers("".join(analysis.lines[r] for r in range(*unit.rows)
                                           if r < len(analysis.lines))) - COMMON)
             for unit in analysis.units]
    _unit_names.put(id(analysis), (analysis, names))
    return names


def similarities(analysis: FileAnalysis, query: frozenset[str]) -> list[float]:
    """Jaccard similarity of each body and top-level code unit to `query` (0 below MIN_SIMILARITY,
    and for every other kind: signatures, docstrings, imports, comments and variables come in for
    the names they define)."""
    out = [0.0] * len(analysis.units)
    if not query:
        return out
    for u, (unit, names) in enumerate(zip(analysis.units, unit_names(analysis))):
        if unit.kind not in ("body", "code") or not names:
            continue
        shared = len(names & query)
        similarity = shared / (len(names) + len(query) - shared)
        if similarity >= MIN_SIMILARITY:
            out[u] = similarity
    return out
