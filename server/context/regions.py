"""Regions of a source file and their scores: what deserves a place in the model's token budget.

A file is cut into units (spans of whole lines, each line in exactly one unit): the signature of a
definition, its docstring and leading comments, chunks of its body, import statements, top-level
code and comments. Units are scored for a cursor with the WEIGHTS table below; far.py picks the
best-scoring units that fit the budget and rendering.py renders them in file order.

Analyses are cached by xxhash of the content, so an unchanged file (another open document, the part
of the current one outside the function being edited) is never re-analysed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..caching import LRU, content_hash
from .. import languages

# --- the one table to tune ----------------------------------------------------------------------
# Scores are comparable across kinds: the packer takes units by descending score while they fit.
WEIGHTS = {
    # the definitions enclosing the cursor (class and function): their signatures always
    "enclosing_signature": 10.0,
    "enclosing_docstring": 5.0,   # docstring / leading comments of an enclosing definition
    "enclosing_body": 2.0,        # enclosing function body above the near window (times proximity)
    # definitions of the symbols used near the cursor, in this file
    "used_signature": 4.0,
    "used_docstring": 2.2,        # docstrings and leading comments attached to them (their heads)
    "used_variable": 3.5,         # constants, types, structs: kept whole
    "used_body": 0.9,             # bodies only if budget remains
    "binds_used": 3.0,            # the nearest code above the cursor assigning a name used near it
    # ... and in the other open documents of the same language (signatures first)
    "other_signature": 3.0,
    "other_docstring": 1.5,
    "other_variable": 2.8,
    "other_body": 0.5,
    # the outline: signatures of the other methods of the enclosing class, and of top-level definitions
    "sibling_signature": 0.5,
    "outline_signature": 0.1,
    # imports: kept when a symbol near the cursor comes from them
    "import_used": 3.0,
    "import_unused": 0.05,
    # everything else, by distance from the cursor (times proximity)
    "nearby_code": 1.5,           # code and comments above/below the near window
    "far_code": 0.1,              # floor for code anywhere in the file
    # code like the lines above the cursor (similar.py), here or in another open file (times similarity)
    "similar_code": 2.5,
    # code where the user last edited, here (away from the cursor) or in another open file, as
    # llama.vim keeps chunks of what was edited lately (times proximity to the edit)
    "recent_code": 1.0,
    # the share of attention the lines above the cursor pay to a unit, when the model was asked
    # (engine/decoding/attention.py; times the share): off unless a packer is given attention
    "attended_code": 20.0,
}
DOC_REST = 0.25  # the rest of a long docstring scores this share of its head
PROXIMITY_LINES = 25.0  # proximity = exp(-distance_in_lines / PROXIMITY_LINES)
AMBIGUITY_DECAY = 0.5  # the k-th nearest definition of a name defined several times scores 0.5**k
BODY_CHUNK_LINES = 8  # bodies and top-level code are cut into chunks of about this many lines
DOC_HEAD_LINES = 4  # a long docstring or comment: its first lines (and closing line) are one unit, the rest another
USE_WINDOW_LINES = 80  # identifiers this close to the cursor (within its function) count as used
SHOWN_FACTOR = 0.5  # ... and those shown above its function (the near prefix runs on): this share
RECENT_LINES = 32  # code this close to a lately edited row is recent code (llama.vim's chunks: 64 lines)

# Groups of weights that `memosight bench context --ablate` switches off, one group at a time.
REGION_KINDS = {
    "signatures": ("enclosing_signature", "used_signature", "other_signature", "sibling_signature",
                   "outline_signature"),
    "docstrings": ("enclosing_docstring", "used_docstring", "other_docstring"),
    "far_definitions": ("used_signature", "used_variable", "used_body", "used_docstring", "binds_used"),
    "imports": ("import_used", "import_unused"),
    "other_files": ("other_signature", "other_docstring", "other_variable", "other_body"),
    "nearby_code": ("nearby_code", "enclosing_body"),
    "recent_code": ("recent_code",),
    "similar_code": ("similar_code",),
    "attended_code": ("attended_code",),
}


def without(kinds, weights: dict | None = None) -> dict:
    """`weights` (default WEIGHTS) with the groups `kinds` of REGION_KINDS set to 0."""
    out = dict(WEIGHTS if weights is None else weights)
    for kind in kinds:
        if kind not in REGION_KINDS:
            raise ValueError(f"unknown region kind {kind!r}; choose from {', '.join(REGION_KINDS)}")
        out.update(dict.fromkeys(REGION_KINDS[kind], 0.0))
    return out


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names a line binds: assignment targets (`a, self.b = ...`, `let x =`, `x := ...`), loop and `as` names.
ASSIGNED = re.compile(r"[\w., \t\[\]*]+")
DECLARATION_WORDS = re.compile(r"^[ \t]*(?:(?:let|const|var|mut)[ \t]+)*")
LOOP_OR_AS = re.compile(r"\bfor[ \t]+([\w \t,()]+?)[ \t]+in\b|\bas[ \t]+(\w+)")
# Words of import syntax and very common names: never a reason to keep an import or a definition.
STOP_WORDS = frozenset({
    "import", "from", "as", "use", "crate", "self", "super", "pub", "package", "require", "export",
    "default", "type", "const", "let", "var", "mod", "cls", "this", "in", "is", "not", "and", "or",
    "if", "else", "for", "while", "return", "def", "class", "fn", "func", "function", "None", "True",
    "False", "null", "true", "false", "nil", "new",
})


@dataclass
class Unit:
    """A span of whole lines that is kept or elided as one piece."""

    kind: str  # signature | docstring | body | variable | import | comment | code
    rows: tuple[int, int]  # [start, end) 0-based rows; a signature may add its closing row
    definition: int = -1  # index into FileAnalysis.definitions; -1 for top-level code
    extra_rows: tuple[int, ...] = ()  # a signature's closing `}` row; a docstring head's closing row
    names: frozenset[str] = frozenset()  # identifiers an import brings in
    head: bool = True  # False for the rest of a long docstring, after its head

    def all_rows(self) -> list[int]:
        return [*range(*self.rows), *self.extra_rows]


@dataclass
class Definition:
    name: str
    kind: str  # function | class | variable
    start: int  # first row, wrappers (decorators, export) included
    end: int  # last row, inclusive
    parent: int  # enclosing definition index, -1 at top level
    signature: int = -1  # unit index of its signature (or of the whole item for variables)
    units: list[int] = field(default_factory=list)  # its docstring, leading comment and body units


@dataclass
class FileAnalysis:
    lines: list[str]  # split on "\n", endings kept
    units: list[Unit]
    definitions: list[Definition]
    symbols: dict[str, list[int]]  # name -> definition indices
    imports: dict[str, list[int]]  # name -> import unit indices
    binds: dict[str, list[int]] = field(default_factory=dict)  # name -> code/body units assigning it, in row order

    def enclosing(self, row: int) -> list[int]:
        """Definition indices containing `row`, outermost first."""
        return [i for i, d in enumerate(self.definitions) if d.start <= row <= d.end]

    def required(self, unit: int) -> list[int]:
        """Units that must come with `unit` so its place in the structure shows: the signatures of
        its definition and of the definitions around it."""
        out = []
        d = self.units[unit].definition
        while d >= 0:
            sig = self.definitions[d].signature
            if sig != unit and sig >= 0:
                out.append(sig)
            d = self.definitions[d].parent
        return out


_analyses = LRU(16)  # (grammar, content hash) -> FileAnalysis


def analyze(text: str, tree, language_id: str) -> FileAnalysis:
    """The units, definitions and symbol table of a file (cached by language and content hash)."""
    key = (languages.GRAMMAR_FOR_LANGUAGE_ID.get(language_id, ""), content_hash(text))
    cached = _analyses.get(key)
    if cached is None:
        cached = _analyze(text, tree, language_id)
        _analyses.put(key, cached)
    return cached


def _inside_function(node, spec) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type in spec.function_types:
            return True
        parent = parent.parent
    return False


def _body_of(node, spec, kind: str):
    """The body of a function-like or container definition, or None (kept whole)."""
    body = node.child_by_field_name("body") if kind != "variable" else None
    if kind == "variable" and node.type in ("lexical_declaration", "variable_declaration") and node.named_child_count:
        value = node.named_children[0].child_by_field_name("value")  # const f = () => { ... }
        if value is not None and value.type in spec.function_types:
            body = value.child_by_field_name("body")
    return body


def _analyze(text: str, tree, language_id: str) -> FileAnalysis:
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    n = len(lines)
    spec = languages.spec_for(language_id)
    units: list[Unit] = []
    definitions: list[Definition] = []
    owner = [-1] * n
    if tree is None or spec is None:
        return FileAnalysis(lines, units, definitions, {}, {})

    found = []  # (start, -end, kind, name, node)
    imports, comment_rows, docstrings = [], set(), []
    inside_literal: set[int] = set()  # rows inside a multi-line string or comment: never a place to cut
    for match in languages.matches(language_id, tree.root_node):
        for capture, nodes in match.items():
            if capture.startswith("definition."):
                node = nodes[0]
                if _inside_function(node, spec):
                    continue
                outer = node.parent if node.parent is not None and node.parent.type in spec.wrappers else node
                name_nodes = match.get("name") or []
                name = name_nodes[0].text.decode("utf-8", "replace") if name_nodes else ""
                found.append((outer.start_point[0], -outer.end_point[0], capture.split(".", 1)[1], name, node))
            elif capture == "import":
                for node in nodes:
                    if not _inside_function(node, spec):
                        imports.append(node)
            elif capture == "comment":
                for node in nodes:
                    comment_rows.update(range(node.start_point[0], node.end_point[0] + 1))
                    inside_literal.update(range(node.start_point[0] + 1, node.end_point[0] + 1))
            elif capture == "string":
                for node in nodes:
                    inside_literal.update(range(node.start_point[0] + 1, node.end_point[0] + 1))
            elif capture == "docstring":
                docstrings.extend(nodes)
    found.sort(key=lambda f: (f[0], f[1]))

    def new_unit(unit: Unit) -> int:
        units.append(unit)
        index = len(units) - 1
        for row in unit.all_rows():
            if 0 <= row < n:
                owner[row] = index
        return index

    # Outer definitions first; inner ones then take over their rows.
    stack: list[int] = []
    body_rows: dict[int, tuple[int, int]] = {}
    for start, neg_end, kind, name, node in found:
        end = min(-neg_end, n - 1)  # a node may end on the empty row after the last newline
        if start > end:
            continue
        while stack and definitions[stack[-1]].end < start:
            stack.pop()
        parent = stack[-1] if stack else -1
        index = len(definitions)
        definitions.append(Definition(name, kind, start, end, parent))
        body = _body_of(node, spec, kind)
        if kind == "variable" and body is not None:
            kind = definitions[index].kind = "function"
        if body is None or body.end_point[0] == body.start_point[0]:
            definitions[index].signature = new_unit(Unit("variable" if kind == "variable" else "signature",
                                                         (start, end + 1), index))
        else:
            # The header runs to the end of what precedes the body (comments aside), and takes the
            # body's first row when the body starts mid-line (`fn f() {`) or with a brace of its own.
            body_start = min(body.start_point[0], end)
            before = body.prev_sibling
            while before is not None and before.is_extra:
                before = before.prev_sibling
            header_end = before.end_point[0] if before is not None else body_start - 1
            if header_end == body_start or lines[body_start].lstrip().startswith("{"):
                header_end = body_start
            header_end = max(header_end, start)
            closing = ()
            if end > header_end and lines[end].strip() in ("}", "};", "},", "})", "});", "end"):
                closing = (end,)
            definitions[index].signature = new_unit(Unit("signature", (start, header_end + 1), index,
                                                         closing))
            body_rows[index] = (header_end + 1, end + 1 - len(closing))
            for row in range(header_end + 1, end + 1 - len(closing)):
                owner[row] = -2 - index  # provisional: body of `index`
        stack.append(index)

    def doc_units(kind: str, row0: int, row1: int, d: int) -> list[int]:
        """A docstring or comment block; when long, its head (with its closing row, so a string is
        never left open) and the rest."""
        if row1 - row0 < DOC_HEAD_LINES + 2:
            return [new_unit(Unit(kind, (row0, row1 + 1), d))]
        return [new_unit(Unit(kind, (row0, row0 + DOC_HEAD_LINES), d, (row1,))),
                new_unit(Unit(kind, (row0 + DOC_HEAD_LINES, row1), d, head=False))]

    for node in docstrings:
        row0, row1 = node.start_point[0], node.end_point[0]
        d = _innermost(definitions, row0)
        if d >= 0 and row0 > definitions[d].start:
            definitions[d].units.extend(doc_units("docstring", row0, row1, d))
        elif d < 0:
            doc_units("comment", row0, row1, -1)

    # Leading comments (and attributes / decorators on their own lines) belong to the definition below.
    for index, d in enumerate(definitions):
        row = d.start - 1
        while row >= 0 and owner[row] < 0 and (row in comment_rows or lines[row].lstrip().startswith("#[")):
            row -= 1
        if row + 1 < d.start:
            d.units.extend(doc_units("docstring", row + 1, d.start - 1, index))

    import_units: dict[str, list[int]] = {}
    for node in imports:
        row0, row1 = node.start_point[0], node.end_point[0]
        names = frozenset(IDENTIFIER.findall(node.text.decode("utf-8", "replace"))) - STOP_WORDS
        u = new_unit(Unit("import", (row0, row1 + 1), _innermost(definitions, row0), names=names))
        for name in names:
            import_units.setdefault(name, []).append(u)

    # Body chunks and top-level code: runs of rows nobody owns yet, cut at blank lines and at a size.
    row = 0
    while row < n:
        tag = owner[row]
        if tag >= 0 or not lines[row].strip():
            row += 1
            continue
        start = row
        while row < n and owner[row] == tag and (
                row == start or row in inside_literal or (row - start < BODY_CHUNK_LINES and lines[row].strip())):
            row += 1
        d = -2 - tag if tag <= -2 else -1
        kind = "body" if tag <= -2 else ("comment" if all(r in comment_rows for r in range(start, row)) else "code")
        u = new_unit(Unit(kind, (start, row), d))
        if d >= 0:
            definitions[d].units.append(u)

    symbols: dict[str, list[int]] = {}
    for index, d in enumerate(definitions):
        if d.name:
            symbols.setdefault(d.name, []).append(index)
    binds: dict[str, list[int]] = {}
    for u in sorted(range(len(units)), key=lambda u: units[u].rows[0]):
        if units[u].kind in ("body", "code"):
            for name in bound_names("".join(lines[units[u].rows[0]:units[u].rows[1]])):
                binds.setdefault(name, []).append(u)
    return FileAnalysis(lines, units, definitions, symbols, import_units, binds)


def _innermost(definitions: list[Definition], row: int) -> int:
    best = -1
    for i, d in enumerate(definitions):
        if d.start <= row <= d.end:
            best = i  # definitions are sorted outer-first, so the last hit is the innermost
    return best


def identifiers(text: str) -> set[str]:
    """The names used in `text` that could refer to a definition."""
    return set(IDENTIFIER.findall(text)) - STOP_WORDS


def bound_names(text: str) -> set[str]:
    """Names that `text` assigns (roughly, for any language): what a later use may refer to."""
    names = set()
    for line in text.split("\n"):
        eq = line.find("=")
        if eq > 0 and line[eq + 1:eq + 2] not in ("=", ">") and line[eq - 1] not in "=!<>":
            target = line[:eq].rstrip("+-*/%|&^@: \t").split(":", 1)[0]  # `x += 1`, `x := 1`, `x: int = 1`
            target = DECLARATION_WORDS.sub("", target)
            if target and ASSIGNED.fullmatch(target):
                names.update(IDENTIFIER.findall(target))
    for match in LOOP_OR_AS.finditer(text):
        names.update(IDENTIFIER.findall(match.group(1) or match.group(2)))
    return names - STOP_WORDS


def proximity(distance: int) -> float:
    return math.exp(-max(0, distance) / PROXIMITY_LINES)


def score_units(analysis: FileAnalysis, used: set[str], cursor_row: int | None,
                enclosing: list[int] = (), weights: dict | None = None,
                similar: list[float] | None = None, attended: tuple[int, list[float]] | None = None,
                shown: set[str] = frozenset(), recent: tuple[int, ...] = ()) -> list[float]:
    """A score per unit. `cursor_row` is None for another open document (only the definitions of
    the symbols used near the cursor count there). `similar`: each unit's similarity to the code
    being written (similar.py); `attended`: (first row, attention share of each row from it) that
    the lines above the cursor pay to the rows before them (engine/decoding/attention.py); `shown`: names
    in the lines shown above the cursor's function, whose definitions count SHOWN_FACTOR as much;
    `recent`: rows the user edited lately (documents.py)."""
    w = WEIGHTS if weights is None else weights
    same_file = cursor_row is not None
    scores = [0.0] * len(analysis.units)
    if same_file:
        for i, unit in enumerate(analysis.units):
            distance = min(abs(cursor_row - unit.rows[0]), abs(cursor_row - (unit.rows[1] - 1)))
            if unit.kind == "import":
                scores[i] = w["import_unused"]
            else:
                scores[i] = max(w["far_code"], w["nearby_code"] * proximity(distance))
        for d, definition in enumerate(analysis.definitions):
            if definition.parent < 0 or definition.parent in enclosing \
                    and analysis.definitions[definition.parent].kind == "class":
                weight = w["outline_signature"] if definition.parent < 0 else w["sibling_signature"]
                scores[definition.signature] = max(scores[definition.signature], weight)
        for d in enclosing:
            definition = analysis.definitions[d]
            scores[definition.signature] = w["enclosing_signature"]
            for u in definition.units:
                unit = analysis.units[u]
                if unit.kind == "docstring":
                    scores[u] = max(scores[u], w["enclosing_docstring"] * (1 if unit.head else DOC_REST))
                elif definition.kind == "function":
                    distance = cursor_row - unit.rows[1]
                    scores[u] = max(scores[u], w["enclosing_body"] * proximity(distance))
        for name in (used | shown) & analysis.imports.keys():
            for u in analysis.imports[name]:
                scores[u] = max(scores[u], w["import_used"] * (1 if name in used else SHOWN_FACTOR))
        for name in used & analysis.binds.keys():
            above = [u for u in analysis.binds[name] if analysis.units[u].rows[1] <= cursor_row]
            if above:
                scores[above[-1]] = max(scores[above[-1]], w["binds_used"])
    prefix = "used_" if same_file else "other_"
    enclosing = set(enclosing)
    for name in (used | shown) & analysis.symbols.keys():
        # A name defined in many places (`__repr__`, `get`): the nearest definition counts most.
        found = [d for d in analysis.symbols[name] if d not in enclosing]
        if same_file:
            found.sort(key=lambda d: abs(cursor_row - analysis.definitions[d].start))
        for rank, d in enumerate(found):
            definition = analysis.definitions[d]
            factor = AMBIGUITY_DECAY ** rank * (1 if name in used else SHOWN_FACTOR)
            sig_kind = "variable" if definition.kind == "variable" else "signature"
            scores[definition.signature] = max(scores[definition.signature], w[prefix + sig_kind] * factor)
            for u in definition.units:
                unit = analysis.units[u]
                kind = "docstring" if unit.kind == "docstring" else "body"
                scores[u] = max(scores[u], w[prefix + kind] * factor * (1 if unit.head else DOC_REST))
    for u, similarity in enumerate(similar or ()):
        if similarity:
            scores[u] = max(scores[u], w.get("similar_code", 0.0) * similarity)
    if recent and w.get("recent_code"):
        for u, unit in enumerate(analysis.units):
            distance = min(max(0, r - (unit.rows[1] - 1), unit.rows[0] - r) for r in recent)
            if distance < RECENT_LINES:
                scores[u] = max(scores[u], w["recent_code"] * proximity(distance))
    if attended is not None and w.get("attended_code"):
        first, shares = attended
        for u, unit in enumerate(analysis.units):
            share = sum(shares[r - first] for r in range(max(first, unit.rows[0]), min(unit.rows[1], first + len(shares))))
            if share > 0:
                scores[u] = max(scores[u], w["attended_code"] * share)
    return scores
