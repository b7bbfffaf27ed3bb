"""Region extraction per language (small golden files) and scoring."""

from memosight.server.context import regions
from memosight.server.context.regions import WEIGHTS, analyze, bound_names, score_units
from memosight.server.documents import Document


def outline(text: str, language: str):
    """(kind, first line, last line, [closing line,] definition name) per unit, 1-based, in file order."""
    doc = Document("file:///golden", text, language)
    analysis = analyze(*doc.snapshot(), language)
    units = [(u.kind, u.rows[0] + 1, u.rows[1], *(f"+{r + 1}" for r in u.extra_rows),
              analysis.definitions[u.definition].name if u.definition >= 0 else "")
             for u in sorted(analysis.units, key=lambda u: u.rows)]
    return units, sorted(analysis.symbols), sorted(analysis.imports)


PYTHON = '''import os
from pathlib import Path as P

LIMIT = 10  # the most


# Adds things.
@cache
def add(a, b):
    """Sum."""
    c = a + b
    return c


class Box:
    """A box."""
    size = 3

    def grow(self, n):
        # grow it
        self.size += n
        return self.size
'''


def test_python_units():
    units, symbols, imports = outline(PYTHON, "python")
    assert units == [
        ("import", 1, 1, ""), ("import", 2, 2, ""),
        ("variable", 4, 4, "LIMIT"),
        ("docstring", 7, 7, "add"),  # a leading comment belongs to the definition below it
        ("signature", 8, 9, "add"),  # decorators included
        ("docstring", 10, 10, "add"), ("body", 11, 12, "add"),
        ("signature", 15, 15, "Box"), ("docstring", 16, 16, "Box"), ("variable", 17, 17, "size"),
        ("signature", 19, 19, "grow"), ("body", 20, 22, "grow"),
    ]
    assert symbols == ["Box", "LIMIT", "add", "grow", "size"]
    assert {"os", "Path", "P", "pathlib"} <= set(imports) and "import" not in imports


JAVASCRIPT = '''import { parse } from "./parse.js";

// Doubles.
export function double(x) {
  return x * 2;
}

const triple = (x) => {
  return x * 3;
};

class Counter {
  inc() {
    this.n += 1;
  }
}
'''


def test_javascript_units_keep_closing_braces_with_the_signature():
    units, symbols, _ = outline(JAVASCRIPT, "javascript")
    assert units == [
        ("import", 1, 1, ""),
        ("docstring", 3, 3, "double"), ("signature", 4, 4, "+6", "double"), ("body", 5, 5, "double"),
        ("signature", 8, 8, "+10", "triple"), ("body", 9, 9, "triple"),  # an arrow function is a function
        ("signature", 12, 12, "+16", "Counter"), ("signature", 13, 13, "+15", "inc"), ("body", 14, 14, "inc"),
    ]
    assert symbols == ["Counter", "double", "inc", "triple"]


TYPESCRIPT = '''import { readFile } from "fs";

export interface Options {
  depth: number;
}

export class Walker {
  constructor(private opts: Options) {}

  walk(path: string): string[] {
    const out: string[] = [];
    return out;
  }
}
'''


def test_typescript_units():
    units, symbols, imports = outline(TYPESCRIPT, "typescript")
    assert units == [
        ("import", 1, 1, ""), ("variable", 3, 5, "Options"),
        ("signature", 7, 7, "+14", "Walker"), ("signature", 8, 8, "constructor"),
        ("signature", 10, 10, "+13", "walk"), ("body", 11, 12, "walk"),
    ]
    assert "readFile" in imports and symbols == ["Options", "Walker", "constructor", "walk"]


GO = '''package shapes

import (
	"fmt"
	"math"
)

// Pi is the ratio.
const Pi = 3.14

// Circle is round.
type Circle struct {
	R float64
}

// Area of the circle.
func (c Circle) Area() float64 {
	a := Pi * c.R * c.R
	return a
}
'''


def test_go_units():
    units, symbols, imports = outline(GO, "go")
    assert units == [
        ("code", 1, 1, ""), ("import", 3, 6, ""),
        ("docstring", 8, 8, "Pi"), ("variable", 9, 9, "Pi"),
        ("docstring", 11, 11, "Circle"), ("variable", 12, 14, "Circle"),
        ("docstring", 16, 16, "Area"), ("signature", 17, 17, "+20", "Area"), ("body", 18, 19, "Area"),
    ]
    assert symbols == ["Area", "Circle", "Pi"] and {"fmt", "math"} <= set(imports)


RUST = '''use std::collections::HashMap;

/// A counter.
#[derive(Debug)]
pub struct Counter {
    counts: HashMap<String, u32>,
}

impl Counter {
    pub fn new() -> Self {
        Counter { counts: HashMap::new() }
    }
}

const LIMIT: u32 = 10;
'''


def test_rust_units_attach_doc_comments_and_attributes():
    units, symbols, imports = outline(RUST, "rust")
    assert units == [
        ("import", 1, 1, ""),
        ("docstring", 3, 4, "Counter"), ("variable", 5, 7, "Counter"),
        ("signature", 9, 9, "+13", "Counter"), ("signature", 10, 10, "+12", "new"), ("body", 11, 11, "new"),
        ("variable", 15, 15, "LIMIT"),
    ]
    assert symbols == ["Counter", "LIMIT", "new"] and "HashMap" in imports


def test_a_file_with_syntax_errors_still_has_units():
    text = PYTHON.replace("def grow(self, n):", "def grow(self, n:")  # unclosed parenthesis
    doc = Document("file:///broken.py", text, "python")
    assert doc.tree.root_node.has_error
    units, symbols, _ = outline(text, "python")
    assert {"add", "LIMIT"} <= set(symbols) and ("signature", 8, 9, "add") in units


def test_unknown_language_has_no_units():
    units, symbols, imports = outline("some text\n", "plaintext")
    assert units == [] and symbols == [] and imports == []


def test_bound_names():
    text = ("a, self.b = 1\nx: int = 3\ny += 2\nfor i, j in z:\nwith open(f) as fh:\nif a == b:\nf(k=1)\n"
            "let mut q = 2;\nr := 3\nconst f = (a) => a;\n")
    assert bound_names(text) == {"a", "b", "x", "y", "i", "j", "fh", "q", "r", "f"}


def test_scores_rank_enclosing_then_used_definitions_then_far_code():
    doc = Document("file:///a.py", PYTHON + "\n\ndef use():\n    return add(LIMIT, 1) + os.sep\n", "python")
    analysis = analyze(*doc.snapshot(), "python")
    cursor_row = analysis.lines.index("    return add(LIMIT, 1) + os.sep\n")
    enclosing = analysis.enclosing(cursor_row)
    scores = score_units(analysis, regions.identifiers(analysis.lines[cursor_row]), cursor_row, enclosing)
    by = {(u.kind, analysis.definitions[u.definition].name if u.definition >= 0 else u.rows[0]): scores[i]
          for i, u in enumerate(analysis.units)}
    assert by[("signature", "use")] == WEIGHTS["enclosing_signature"]
    assert by[("signature", "add")] == WEIGHTS["used_signature"] > by[("body", "add")]
    assert by[("variable", "LIMIT")] == WEIGHTS["used_variable"]
    assert by[("import", 0)] == WEIGHTS["import_used"] > by[("import", 1)]  # os is used, Path is not
    assert by[("body", "grow")] <= WEIGHTS["nearby_code"]  # unused code counts by its distance only


def test_the_nearest_of_several_definitions_of_a_name_counts_most():
    text = ("class A:\n    def run(self):\n        pass\n\n\n"
            "class B:\n    def run(self):\n        pass\n\n\nx = B().run()\n")
    doc = Document("file:///a.py", text, "python")
    analysis = analyze(*doc.snapshot(), "python")
    scores = score_units(analysis, {"run"}, 10, [])
    a_run, b_run = (analysis.definitions[d].signature for d in analysis.symbols["run"])
    assert scores[b_run] == WEIGHTS["used_signature"] and scores[a_run] < scores[b_run]


def test_other_files_score_only_the_definitions_used_near_the_cursor():
    doc = Document("file:///b.py", PYTHON, "python")
    analysis = analyze(*doc.snapshot(), "python")
    scores = score_units(analysis, {"add"}, None)
    assert max(scores) == WEIGHTS["other_signature"]
    assert sum(1 for s in scores if s > 0) == 4  # add's signature, comment, docstring and body


def test_analyses_are_cached_by_content():
    doc = Document("file:///a.py", PYTHON, "python")
    first = analyze(*doc.snapshot(), "python")
    assert analyze(*Document("file:///other.py", PYTHON, "python").snapshot(), "python") is first


def test_long_docstrings_split_into_a_head_with_its_closing_line_and_the_rest():
    doc_lines = "".join(f"    line {i}\n" for i in range(10))
    text = f'def f():\n    """Summary.\n\n{doc_lines}    """\n    return 1\n'
    units, _, _ = outline(text, "python")
    assert ("docstring", 2, 5, "+14", "f") in units  # head: first lines, plus the closing quotes
    assert ("docstring", 6, 13, "f") in units


def test_body_chunks_never_cut_a_multi_line_string():
    sql = "".join(f"        column_{i},\n" for i in range(20))
    text = f'def query():\n    a = 1\n    q = """\n        SELECT\n{sql}    """\n    return q\n'
    units, _, _ = outline(text, "python")
    bodies = [u for u in units if u[0] == "body"]
    string_end = 3 + 1 + 20 + 1  # the row of the closing quotes
    assert any(u[1] <= 3 and u[2] >= string_end for u in bodies), bodies
