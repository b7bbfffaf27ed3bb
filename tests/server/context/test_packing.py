"""The compressor: budgets, elision markers, needles, stability while typing, fallbacks."""

import re

import pytest
from memosight.server.context.packing import ContextCompressor
from memosight.server.context.regions import WEIGHTS
from memosight.server.context.truncation import truncate_around_cursor
from memosight.server.documents import Document, Position

WORDS = lambda text: len(text.split())  # noqa: E731 - a stand-in for the model's tokenizer
CHARS = lambda text: (len(text) + 3) // 4  # noqa: E731
PIECES = lambda text: len(re.findall(r"\w+|[^\w\s]+|\s+", text))  # noqa: E731


def python_module(functions: int = 60) -> str:
    parts = ["import os\nimport sys\n\nLIMIT = 7919  # the needle\n"]
    for i in range(functions):
        parts.append(f"\n\ndef helper_{i}(value, scale={i}):\n    \"\"\"Helper number {i}.\"\"\"\n"
                     f"    total = value * scale\n    for k in range({i}):\n        total += k\n"
                     f"    return total + os.getpid()\n")
    return "".join(parts)


def cursor_after(doc: Document, snippet: str) -> int:
    return doc.text.index(snippet) + len(snippet)


@pytest.mark.parametrize("count", [WORDS, CHARS, PIECES], ids=["words", "chars", "pieces"])
@pytest.mark.parametrize("budget", [64, 200, 700])
def test_the_budget_is_never_exceeded(count, budget):
    doc = Document("file:///m.py", python_module(), "python")
    compressor = ContextCompressor()
    for offset in range(0, len(doc.text), 997):
        packed = compressor.build(doc, offset, budget, 0.25, count)
        assert packed.prompt_tokens == count(packed.prefix) + count(packed.suffix) <= budget
        line_start = doc.text.rfind("\n", 0, offset) + 1
        assert packed.prefix.endswith(doc.text[line_start:offset])  # the cursor's own line, up to it
        assert packed.suffix.startswith(doc.text[offset:offset + 5].split("\n")[0])


def test_skipped_spans_become_elision_markers_in_the_languages_comment_syntax():
    doc = Document("file:///m.py", python_module() + "\n\ndef use():\n    return helper_3(2) + ", "python")
    packed = ContextCompressor().build(doc, len(doc.text), 150, 0.25, PIECES)
    assert "# ...\n" in packed.prefix
    # the used helper's signature and docstring; its body elided by a marker indented like the body
    assert re.search(r'def helper_3\(value, scale=3\):\n    """Helper number 3."""\n    # \.\.\.\n', packed.prefix)
    js = "".join(f"function f{i}(a) {{\n  const b = a + {i};\n  return b;\n}}\n\n" for i in range(80))
    js_doc = Document("file:///m.js", js + "function g() {\n  return f3(1);\n}\n", "javascript")
    packed = ContextCompressor().build(js_doc, cursor_after(js_doc, "  return f3("), 120, 0.25, PIECES)
    assert "// ..." in packed.prefix and "# ..." not in packed.prefix
    assert "function f3(a) {" in packed.prefix  # a used function: its signature ...
    assert "\n}\n" in packed.prefix  # ... with its closing brace, body elided if need be


def test_the_enclosing_class_and_function_signatures_are_always_there():
    methods = "".join(f"    def m{i}(self, x):\n        y = x + {i}\n        return y * 2\n\n" for i in range(200))
    text = f"class Big(Base):\n    \"\"\"A big class.\"\"\"\n\n{methods}"
    doc = Document("file:///c.py", text, "python")
    packed = ContextCompressor().build(doc, cursor_after(doc, "def m150(self, x):\n        y = x"), 120, 0.25,
                                       PIECES)
    assert packed.prefix.startswith("class Big(Base):\n")
    assert "    def m150(self, x):\n        y = x" in packed.prefix


def test_needle_a_constant_thousands_of_lines_above():
    text = python_module(600) + "\n\ndef use():\n    limit = LIMIT\n    "
    doc = Document("file:///m.py", text, "python")
    assert text.count("\n") > 4000
    packed = ContextCompressor().build(doc, len(text), 256, 0.25, PIECES)
    assert "LIMIT = 7919  # the needle\n" in packed.prefix
    assert packed.prefix.endswith("def use():\n    limit = LIMIT\n    ")


def test_needle_a_helper_in_another_open_document():
    helper = Document("file:///pkg/util.py", python_module(5) + "\n\ndef far_helper(count, scale=3):\n"
                      "    return count * scale\n", "python")
    unrelated = Document("file:///pkg/other.js", "function far_helper() {}\n", "javascript")
    doc = Document("file:///pkg/main.py", python_module(40) + "\n\ndef use(items):\n    n = far_helper(len(items))\n"
                   "    ", "python")
    packed = ContextCompressor().build(doc, len(doc.text), 256, 0.25, PIECES, [helper, unrelated, doc])
    assert "# file: util.py\n" in packed.prefix and "def far_helper(count, scale=3):\n" in packed.prefix
    assert "function far_helper" not in packed.prefix  # other languages stay out
    region = next(r for r in packed.regions if r.path == "/pkg/util.py")
    assert region.kind == "signature" and region.score > 0


def test_typing_inside_a_function_keeps_the_prompt_head_stable():
    doc = Document("file:///m.py", python_module() + "\n\ndef use(items):\n    n = helper_3(len(items))\n    \n"
                   "\n\ndef after():\n    return helper_7(1)\n", "python")
    compressor = ContextCompressor()
    row = doc.text[:doc.text.index("    \n\n\ndef after")].count("\n")
    line = "return n + LIMIT + sum(helper_5(i) for i in items)"
    previous = None
    heads = []
    for i, ch in enumerate(line):
        doc.apply_change(ch, Position(row, 4 + i), Position(row, 4 + i))
        packed = compressor.build(doc, doc.offset_at(Position(row, 5 + i)), 300, 0.25, PIECES)
        assert packed.prefix.endswith("    " + line[:i + 1]) and packed.prompt_tokens <= 300
        if previous is not None:
            heads.append(packed.prefix.startswith(previous))
        previous = packed.prefix
    assert sum(heads) / len(heads) > 0.9  # the new prefix extends the previous one


STACK_HEAD = ('import threading\n\n_state = threading.local()\n\n\ndef push_item(item) -> None:\n'
              '    """Puts an item on the stack."""\n    _state.stack.append(item)\n\n\n')
STACK_BODY = 'def pop_item() -> None:\n    """Takes the top item off the stack."""\n    _state.stack.pop()\n'
STACK_TAIL = ('\n\ndef resolve_default(value: bool | None = None) -> bool:\n    """Works out the default of the flag.'
              '  When a\n    value is given it comes back as it is, else it is read from the\n    current item on the'
              ' stack.\n\n    :param value: the value, or None.\n    """\n    if value is not None:\n        return value'
              '\n\n    item = top_item(silent=True)\n\n    if item is not None:\n        return item.flag\n\n    return False\n'
              + "".join(f'\n\ndef other_{i}(x):\n    """Other helper {i} with a longer docstring line."""\n'
                        f'    return x + {i}\n' for i in range(6)))


@pytest.mark.parametrize("budget", [200, 300, 400])
def test_typing_a_function_keeps_the_suffix_identical(budget):
    # As the typed function grows, its extent (and the split between the rest of it and the far
    # code below) moves; the text after the cursor does not, and neither may the suffix, which a
    # suffix-first prompt reads before everything else (a change there costs the whole KV cache).
    from memosight.server.bench.replay import keystrokes

    doc = Document("file:///g.py", STACK_HEAD + STACK_TAIL, "python")
    compressor = ContextCompressor()
    cursor, suffixes = len(STACK_HEAD), []
    for key in keystrokes(STACK_BODY):
        row = doc.text[:cursor].count("\n")
        col = cursor - (doc.text.rfind("\n", 0, cursor) + 1)
        doc.apply_change(key, Position(row, col), Position(row, col))
        cursor += len(key)
        suffixes.append(compressor.build(doc, cursor, budget, 0.25, CHARS).suffix)
    assert len(set(suffixes)) == 1 and "def resolve_default" in suffixes[0]


def test_an_unclosed_docstring_does_not_reshuffle_the_prompt_head():
    # An opened docstring swallows the rest of the file until it is closed; the function around the
    # cursor is briefly gone from the parse tree, which must not move the near window.
    doc = Document("file:///m.py", python_module() + "\n\ndef use(items):\n    \n\n\ndef after():\n    return 1\n",
                   "python")
    compressor = ContextCompressor()
    row = doc.text[:doc.text.index("    \n\n\ndef after")].count("\n")
    before = compressor.build(doc, doc.offset_at(Position(row, 4)), 300, 0.25, PIECES)
    typed = '"""Sum the helpers'
    for i, ch in enumerate(typed):
        doc.apply_change(ch, Position(row, 4 + i), Position(row, 4 + i))
        packed = compressor.build(doc, doc.offset_at(Position(row, 5 + i)), 300, 0.25, PIECES)
        assert packed.prefix.startswith(before.prefix) and packed.suffix == before.suffix, typed[:i + 1]


def test_moving_to_another_function_changes_the_far_context():
    doc = Document("file:///m.py", python_module(), "python")
    compressor = ContextCompressor()
    a = compressor.build(doc, cursor_after(doc, "def helper_10(value, scale=10):\n"), 200, 0.25, PIECES)
    b = compressor.build(doc, cursor_after(doc, "def helper_50(value, scale=50):\n"), 200, 0.25, PIECES)
    assert "def helper_10" in a.prefix and "def helper_50" in b.prefix and a.prefix != b.prefix


def test_regions_are_listed_in_the_documented_shape():
    doc = Document("file:///m.py", python_module(), "python")
    packed = ContextCompressor().build(doc, cursor_after(doc, "def helper_30(value, scale=30):\n"), 200, 0.25, PIECES)
    out = packed.to_json()
    assert set(out) == {"prefix", "suffix", "prompt_tokens", "regions"}
    kinds = [r["kind"] for r in out["regions"]]
    assert "cursor_prefix" in kinds and "cursor_suffix" in kinds
    for r in out["regions"]:
        assert set(r) == {"path", "start_line", "end_line", "kind", "score"} and r["start_line"] <= r["end_line"]
    prefix_lines = [r for r in out["regions"] if r["kind"] != "cursor_suffix"]
    assert [r["start_line"] for r in prefix_lines] == sorted(r["start_line"] for r in prefix_lines)  # file order


def test_unknown_languages_fall_back_to_a_line_window():
    text = "".join(f"line {i} of plain text\n" for i in range(500))
    doc = Document("file:///notes.txt", text, "plaintext")
    cursor = text.index("line 250")
    packed = ContextCompressor().build(doc, cursor, 100, 0.25, WORDS)
    expected = truncate_around_cursor(text, cursor, 100, 0.25, WORDS)
    assert (packed.prefix, packed.suffix) == (expected.prefix, expected.suffix)
    assert packed.prompt_tokens <= 100 and packed.prefix.endswith("line 249 of plain text\n")


def test_files_with_syntax_errors_still_produce_context():
    text = python_module(80).replace("def helper_40(value, scale=40):", "def helper_40(value, scale=40:") \
        + "\n\ndef use(:\n    x = helper_2(LIMIT"
    doc = Document("file:///broken.py", text, "python")
    assert doc.tree.root_node.has_error
    packed = ContextCompressor().build(doc, len(text), 200, 0.25, PIECES)
    assert packed.prefix.endswith("x = helper_2(LIMIT") and packed.prompt_tokens <= 200
    assert "def helper_2(value, scale=2):" in packed.prefix


def test_a_name_typed_inside_a_function_keeps_the_prompt_head_and_comes_in_at_the_next_choice():
    # A new choice of the far parts costs the KV cache of the whole prompt after them: typing in one
    # place never brings one; the definition of a name typed there comes in when the parts are chosen
    # again (here: the cursor's window seen afresh).
    doc = Document("file:///m.py", python_module(300) + "\n\ndef use(items):\n    total = 0\n    \n", "python")
    compressor = ContextCompressor()
    row = doc.line_count - 2
    before = compressor.build(doc, doc.offset_at(Position(row, 4)), 256, 0.25, PIECES)
    assert "LIMIT = 7919" not in before.prefix
    head = before.prefix[:before.prefix.rindex("def use(items):")]
    typed = "limit = LIMIT + 1"
    for i, ch in enumerate(typed):
        doc.apply_change(ch, Position(row, 4 + i), Position(row, 4 + i))
        packed = compressor.build(doc, doc.offset_at(Position(row, 5 + i)), 256, 0.25, PIECES)
        assert packed.prefix.startswith(head)  # byte-identical above the cursor's function
    fresh = ContextCompressor().build(doc, doc.offset_at(Position(row, 4 + len(typed))), 256, 0.25, PIECES)
    assert "LIMIT = 7919  # the needle\n" in fresh.prefix


def test_the_suffix_closes_the_blocks_around_the_cursor():
    methods = "".join(f"  m{i}(a) {{\n    const b = a + {i};\n    return b;\n  }}\n\n" for i in range(60))
    doc = Document("file:///k.ts", f"export class K {{\n{methods}}}\n", "typescript")
    packed = ContextCompressor().build(doc, cursor_after(doc, "const b = a + 30;\n"), 120, 0.25, PIECES)
    assert packed.prefix.startswith("export class K {\n")
    assert packed.suffix.startswith("    return b;\n  }\n") and packed.suffix.endswith("}\n")
    assert "// ..." in packed.suffix  # the methods below, elided


@pytest.mark.parametrize("budget", [1, 10, 30])
@pytest.mark.parametrize("suffix_share", [0.0, 0.9])
def test_tiny_budgets_and_any_suffix_share_stay_within_budget(budget, suffix_share):
    doc = Document("file:///m.py", python_module(30), "python")
    compressor = ContextCompressor()
    for offset in range(0, len(doc.text), 331):
        packed = compressor.build(doc, offset, budget, suffix_share, PIECES)
        assert packed.prompt_tokens == PIECES(packed.prefix) + PIECES(packed.suffix) <= budget


def test_the_near_prefix_runs_on_above_a_short_function_as_plain_lines():
    doc = Document("file:///m.py", python_module() + "\n\ndef use(value):\n    total = value\n    ", "python")
    packed = ContextCompressor().build(doc, len(doc.text), 300, 0.0, PIECES)
    # the helper right above the cursor's function, whole and unmarked, as plain truncation would show it
    assert packed.prefix.endswith("    return total + os.getpid()\n\n\ndef use(value):\n    total = value\n    ")
    near = next(r for r in packed.regions if r.kind == "cursor_prefix")
    assert near.start_line < doc.text.count("\n") - 5
    only_function = ContextCompressor(contiguous_near=False).build(doc, len(doc.text), 300, 0.0, PIECES)
    assert next(r for r in only_function.regions if r.kind == "cursor_prefix").start_line == doc.text.count("\n") - 1


def test_names_used_in_the_function_outrank_names_only_shown_above_it():
    helpers = "".join(f"def shown_{i}(a, b):\n    return a + b * {i}\n\n\n" for i in range(20))
    lines_above = "".join(f"    shown_{i}(1, 2)\n" for i in range(20))
    text = (helpers + "LIMIT = 7919\n\n\n" + "\n\n".join(f"def filler_{i}():\n    return {i}" for i in range(200))
            + "\n\n\ndef caller():\n" + lines_above + "\n\ndef user():\n    n = LIMIT\n    ")
    doc = Document("file:///m.py", text, "python")
    packed = ContextCompressor().build(doc, len(text), 260, 0.0, PIECES)
    # LIMIT, used in the cursor's function, comes in before the helpers only shown above it
    assert "LIMIT = 7919" in packed.prefix
    assert "def shown_" in packed.prefix  # ... which still come, as budget allows


def test_a_remembered_near_start_is_never_reused_for_another_function():
    doc = Document("file:///m.py", python_module(), "python")
    compressor = ContextCompressor()
    low_row = doc.text.count("\n") - 1
    remembered = next(r for r in compressor.build(doc, doc.offset_at(Position(low_row, 4)), 300, 0.0, PIECES).regions
                      if r.kind == "cursor_prefix").start_line - 1
    # a cursor in an earlier function, below that remembered start: its own near prefix starts higher up
    row = next(r for r in range(remembered + 2, low_row - 10) if doc.text.split("\n")[r].startswith("    total = "))
    near = next(r for r in compressor.build(doc, doc.offset_at(Position(row, 4)), 300, 0.0, PIECES).regions
                if r.kind == "cursor_prefix")
    fresh = next(r for r in ContextCompressor().build(doc, doc.offset_at(Position(row, 4)), 300, 0.0,
                                                      PIECES).regions if r.kind == "cursor_prefix")
    assert near.start_line == fresh.start_line < remembered


def test_a_first_line_longer_than_the_budget_keeps_its_tail():
    text = "VALUES = [" + ", ".join(str(i) for i in range(2000)) + ", "
    packed = ContextCompressor().build(Document("file:///m.py", text, "python"), len(text), 128, 0.0, PIECES)
    assert packed.prefix and text.endswith(packed.prefix) and packed.prompt_tokens <= 128


def test_code_edited_lately_in_another_open_file_comes_in():
    # Nothing near the cursor names the other file's code: only its having been edited brings it.
    other = Document("file:///pkg/notes.py", python_module(30), "python")
    row = other.text[:other.text.index("def helper_21(")].count("\n")
    doc = Document("file:///pkg/main.py", python_module(40) + "\n\ndef use(items):\n    ", "python")
    before = ContextCompressor().build(doc, len(doc.text), 300, 0.25, PIECES, [other])
    assert "helper_21" not in before.prefix
    other.apply_change("v", Position(row + 3, 4), Position(row + 3, 5))  # the user worked there
    after = ContextCompressor().build(doc, len(doc.text), 300, 0.25, PIECES, [other])
    assert "# file: notes.py\n" in after.prefix and "def helper_21(value, scale=21):" in after.prefix
    assert after.prompt_tokens <= 300
    switched_off = ContextCompressor(weights={**WEIGHTS, "recent_code": 0.0})
    assert "helper_21" not in switched_off.build(doc, len(doc.text), 300, 0.25, PIECES, [other]).prefix


def test_the_blank_lines_after_the_cursors_function_stay_in_the_suffix():
    body = "".join(f"def f{i}(x):\n    \"\"\"Doc {i}.\"\"\"\n    y = x + {i}\n    return y\n\n\n" for i in range(40))
    text = body + "class A:\n    def m(self, v):\n        \n        return v\n\n\ndef g(z):\n    return z\n"
    doc = Document("file:///t.py", text, "python")
    packed = ContextCompressor().build(doc, text.index("        \n        return v") + 8, 200, 0.25, PIECES)
    assert packed.suffix == "\n        return v\n\n\ndef g(z):\n    return z\n"


def test_an_open_file_redefining_a_builtin_is_no_definition_of_it():
    shim = Document("file:///pkg/compat.py", "import sys\n\nstr = str\nbytes = bytes\n", "python")
    doc = Document("file:///pkg/main.py", python_module(40) + "\n\ndef use(v):\n    return str(v) + ", "python")
    packed = ContextCompressor().build(doc, len(doc.text), 300, 0.25, PIECES, [shim])
    assert "str = str" not in packed.prefix
    own = Document("file:///pkg/files.py", "def open(path, mode='rb'):\n    return path\n", "python")
    doc = Document("file:///pkg/main.py", "from .files import open\n" + python_module(40)
                   + "\n\ndef use(v):\n    return open(v) + ", "python")
    packed = ContextCompressor().build(doc, len(doc.text), 300, 0.25, PIECES, [own])
    assert "def open(path, mode='rb'):" in packed.prefix  # imported: the project's own open


def test_a_visit_to_far_code_of_this_file_brings_it_in_on_the_next_keystroke():
    doc = Document("file:///pkg/main.py", python_module(60) + "\n\ndef use(items):\n    ", "python")
    compressor = ContextCompressor()
    assert "def helper_5(" not in compressor.build(doc, len(doc.text), 300, 0.25, PIECES).prefix
    doc.recent_rows = (doc.text[:doc.text.index("def helper_5(")].count("\n") + 2,)  # the user looked there
    assert "def helper_5(value, scale=5):" in compressor.build(doc, len(doc.text), 300, 0.25, PIECES).prefix
