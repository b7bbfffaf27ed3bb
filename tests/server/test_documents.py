import pytest
from memosight.server.documents import Document, Position, utf16_len


def test_utf16_columns_count_astral_characters_twice():
    doc = Document("file:///a.py", "s = '😀中文'\nx\n")
    assert utf16_len("😀") == 2
    # ' is at column 4, the emoji spans 5-6, 中 is at 7.
    assert doc.text[doc.offset_at(Position(0, 7))] == "中"
    assert doc.position_at(doc.text.index("中")) == Position(0, 7)
    # A column inside the surrogate pair never splits the character.
    assert doc.offset_at(Position(0, 6)) == doc.text.index("😀")


def test_crlf_and_lone_cr_end_lines():
    doc = Document("file:///a.py", "a = 1\r\nb = 2\rc = 3\n")
    assert doc.line_count == 4
    assert doc.line_text(0) == "a = 1" and doc.line_text(1) == "b = 2" and doc.line_text(2) == "c = 3"
    assert doc.offset_at(Position(1, 0)) == doc.text.index("b")
    assert doc.offset_at(Position(0, 99)) == doc.text.index("\r")  # past the end of a line: its end


def test_positions_past_the_end_of_the_file_are_clamped():
    doc = Document("file:///a.py", "x = 1\n")
    assert doc.offset_at(Position(40, 3)) == len(doc.text)
    assert doc.clamp(Position(40, 3)) == Position(1, 0)


def test_incremental_changes():
    doc = Document("file:///a.py", "def f():\n    pass\n")
    doc.apply_change("return 1", Position(1, 4), Position(1, 8))
    assert doc.text == "def f():\n    return 1\n"
    edit = doc.apply_change("\n\ndef g():\n    pass", Position(2, 0), Position(2, 0))
    assert doc.text.endswith("def g():\n    pass")
    assert (edit.start, edit.old_end) == (len("def f():\n    return 1\n"),) * 2
    doc.apply_change("whole new text")
    assert doc.text == "whole new text" and doc.line_count == 1


def test_edit_with_emoji_in_the_line():
    doc = Document("file:///a.py", "x = '😀'  # end\n")
    doc.apply_change("ok", Position(0, 12), Position(0, 15))  # the emoji takes two UTF-16 units
    assert doc.text == "x = '😀'  # ok\n"


def test_uri_to_path():
    assert Document("file:///tmp/a%20b.py", "").path == "/tmp/a b.py"


# --- incremental tree-sitter parse ----------------------------------------------------------------

def _fresh_tree(doc: Document):
    return Document(doc.uri, doc.text, doc.language).tree


def test_edits_carry_byte_offsets_and_points_for_tree_sitter():
    doc = Document("file:///a.py", "s = '中'\nx = 1\n", "python")
    edit = doc.apply_change("yy", Position(1, 0), Position(1, 1))  # replace x
    line1 = len("s = '中'\n".encode())
    assert (edit.start, edit.old_end, edit.new_end) == (8, 9, 10)
    assert (edit.start_byte, edit.old_end_byte, edit.new_end_byte) == (line1, line1 + 1, line1 + 2)
    assert edit.start_point == (1, 0) and edit.old_end_point == (1, 1) and edit.new_end_point == (1, 2)
    edit = doc.apply_change("é", Position(0, 6), Position(0, 6))  # after 中: byte column 8
    assert edit.start_point == (0, len("s = '中".encode())) and edit.new_end_point == (0, len("s = '中é".encode()))


def test_incremental_parse_after_edits_equals_a_fresh_parse():
    doc = Document("file:///a.py", "def f(x):\n    return x\n\n\nclass A:\n    pass\n", "python")
    assert doc.tree.root_node.type == "module"
    edits = [
        ("    y = x * 2\n", Position(1, 0), Position(1, 0)),  # insert a line
        ("y", Position(2, 11), Position(2, 12)),  # return x -> return y
        ("中 = '😀'\n", Position(3, 0), Position(3, 0)),  # astral + CJK: UTF-16 vs UTF-8 widths
        ("", Position(0, 0), Position(1, 0)),  # delete the def line: now a syntax error
        ("def g(z):\n", Position(0, 0), Position(0, 0)),
        ("\r\n", Position(4, 0), Position(4, 0)),  # a CRLF line
    ]
    for text, start, end in edits:
        doc.apply_change(text, start, end)
        assert str(doc.tree.root_node) == str(_fresh_tree(doc).root_node), doc.text
    assert "ERROR" not in str(doc.tree.root_node)


def test_typing_char_by_char_keeps_the_tree_current():
    doc = Document("file:///a.ts", "function f(a: number) {\n  \n}\n", "typescript")
    _ = doc.tree
    for i, ch in enumerate("return a + 1;"):
        doc.apply_change(ch, Position(1, 2 + i), Position(1, 2 + i))
    assert str(doc.tree.root_node) == str(_fresh_tree(doc).root_node)
    assert "return_statement" in str(doc.tree.root_node)


def test_whole_document_replacement_and_unknown_languages():
    doc = Document("file:///a.go", "package main\n", "go")
    _ = doc.tree
    doc.apply_change("package other\n\nfunc F() int { return 1 }\n")
    assert str(doc.tree.root_node) == str(_fresh_tree(doc).root_node)
    assert Document("file:///a.txt", "plain text", "plaintext").tree is None


def test_line_starts_stay_right_through_random_edits():
    import random

    rng = random.Random(7)
    pieces = ["a", "\n", "\r", "\r\n", "xy", "😀", "\n\n", ""]
    doc = Document("file:///a.py", "one\r\ntwo\rthree\nfour\n")
    for _ in range(400):
        _ = doc.line_starts  # keep the table live, so edits update it in place
        start = doc.position_at(rng.randrange(len(doc.text) + 1))
        end = doc.position_at(rng.randrange(doc.offset_at(start), len(doc.text) + 1))
        doc.apply_change("".join(rng.choice(pieces) for _ in range(rng.randrange(3))), start, end)
        assert doc.line_starts == Document(doc.uri, doc.text).line_starts, repr(doc.text)


def test_a_text_parsed_before_is_not_parsed_again_and_edits_stay_private():
    text = "def f(x):\n    return x\n"
    first = Document("file:///a.py", text, "python")
    second = Document("file:///b.py", text, "python")
    assert first.tree is not second.tree and str(first.tree.root_node) == str(second.tree.root_node)
    first.apply_change("def g", Position(0, 0), Position(0, 5))
    assert "g" == first.tree.root_node.children[0].child_by_field_name("name").text.decode()
    assert "f" == second.tree.root_node.children[0].child_by_field_name("name").text.decode()
    assert "f" == Document("file:///c.py", text, "python").tree.root_node.children[0] \
        .child_by_field_name("name").text.decode()


# --- issue 14: documents never out of sync, snapshots never changed under a reader -----------------


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from memosight.server.documents import LARGE_DOCUMENT_CHARS, file_path  # noqa: E402

from .lsp_model import FUZZ_EXAMPLES, LspText, edits  # noqa: E402


def test_form_feed_u2028_and_nel_are_not_line_breaks():
    doc = Document("file:///a.py", "import os\n\x0c\nshort = 1\u2028x\x85y\n")
    assert doc.line_count == 4
    assert doc.line_text(1) == "\x0c" and doc.line_text(2) == "short = 1\u2028x\x85y"


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_valid_edits_keep_the_text_equal_to_lsp_s_model(data):
    """Random documents and edits with any characters, LSP's line rules and UTF-16 columns: the
    document equals an independent model after every edit, its positions round-trip, and the
    incrementally edited syntax tree equals a fresh parse."""
    model = LspText(data.draw(edits.documents()))
    doc = Document("file:///fuzz.py", model.text, "python")
    doc.tree  # parse now, so that later edits go through tree.edit
    for _ in range(data.draw(st.integers(1, 8))):
        start, end, new_text = data.draw(edits.change(model))
        doc.apply_change(new_text, Position(*start), Position(*end))
        model.apply(start, end, new_text)
        assert doc.text == model.text
        assert doc.line_starts == model.line_starts()
    for line in range(model.line_count()):
        assert doc.position_at(doc.offset_at(Position(line, 0))) == Position(line, 0)
    fresh = Document("file:///fresh.py", model.text, "python")
    assert str(doc.tree.root_node) == str(fresh.tree.root_node)


def test_a_snapshot_is_not_changed_by_later_edits():
    doc = Document("file:///a.py", "def f():\n    return 1\n", "python")
    text, tree = doc.snapshot()
    frozen = doc.frozen()
    doc.apply_change("x = 2\n", Position(0, 0), Position(0, 0))
    # the live tree was edited (tree.edit drops its source); the reader's copies were not
    assert tree.root_node.children[0].text == b"def f():\n    return 1"
    assert frozen.text == text and frozen.tree.root_node.children[0].text == b"def f():\n    return 1"
    assert doc.snapshot()[1].root_node.children[0].text == b"x = 2"


@pytest.mark.parametrize("uri", ["file:///tmp/a%00b.py", "file:///tmp/\ud800.py", "file:///tmp/%ED%A0%80.py",
                                 "file:///tmp/%FF.py"])
def test_uris_no_file_can_have_are_not_file_paths(uri):
    assert file_path(uri) is None
    assert Document(uri, "x").path == uri


def test_a_large_document_is_read_through_a_window_that_typing_does_not_move():
    line = "value = compute(1, 2)  # a line of some length\n"
    text = line * (LARGE_DOCUMENT_CHARS // len(line) * 3)
    doc = Document("file:///big.py", text, "python")
    cursor = len(text) // 2
    view, at = doc.around(cursor)
    assert view.text[at:] == text[cursor:cursor + len(view.text) - at]
    assert len(view.text) < LARGE_DOCUMENT_CHARS and view.text.endswith("\n")
    assert text[cursor - at - 1] == "\n"  # whole lines
    typed, at2 = Document(doc.uri, text[:cursor] + "abc" + text[cursor:]).around(cursor + 3)
    assert typed.text[:at2 - 3] == view.text[:at]  # the same start: caches keyed on the text above hold
    small = Document("file:///s.py", "x = 1\n")
    assert small.around(3) == (small, 3)



def test_the_other_files_are_the_open_ones_most_recently_edited_first_then_those_closed_lately():
    from memosight.server.documents import DocumentStore

    store = DocumentStore()
    for name in ("a", "b", "c"):
        store.open(f"file:///{name}.py", name, "python", 1)
    store.touch("file:///a.py")  # edited last
    assert [d.uri[-4:] for d in store.recent()] == ["a.py", "c.py", "b.py"]
    store.close("file:///c.py")
    assert [d.uri[-4:] for d in store.recent()] == ["a.py", "b.py", "c.py"] and len(store.all()) == 2
    for i in range(DocumentStore.RECENTLY_CLOSED + 2):
        store.open(f"file:///x{i}.py", "x", "python", 1)
        store.close(f"file:///x{i}.py")
    assert len(store.recent()) == 2 + DocumentStore.RECENTLY_CLOSED and "file:///c.py" not in {
        d.uri for d in store.recent()}  # the oldest closed ones drop out
    store.open("file:///x9.py", "again", "python", 2)  # reopened: open, not closed
    assert store.get("file:///x9.py").text == "again" and sum(d.uri == "file:///x9.py" for d in store.recent()) == 1


def test_recent_rows_remember_the_last_areas_most_recent_first():
    doc = Document("file:///a.py", "x = 1\n" * 400, "python")
    doc.apply_change("y", Position(10, 0), Position(10, 1))
    doc.apply_change("y", Position(12, 0), Position(12, 1))  # the same area: one row, the latest
    assert doc.recent_rows == (12,)
    doc.apply_change("z", Position(300, 0), Position(300, 1))
    assert doc.recent_rows == (300, 12)
    doc.apply_change("a\nb\nc\n", Position(100, 0), Position(100, 0))  # three lines above row 300
    assert doc.recent_rows == (100, 303, 12)
    for row in (150, 200, 250):
        doc.apply_change("q", Position(row, 0), Position(row, 1))
    assert doc.recent_rows == (250, 200, 150, 100)  # RECENT_AREAS of them; 303 was 53 lines off 250
    assert doc.frozen().recent_rows == doc.recent_rows
    doc.apply_change("whole new text")  # a whole replacement says nothing of where
    assert doc.recent_rows == (250, 200, 150, 100)


def test_edited_rows_follow_deletions_reversed_ranges_and_lone_carriage_returns():
    doc = Document("file:///a.py", "x = 1\n" * 400, "python")
    doc.apply_change("y", Position(150, 0), Position(150, 1))
    doc.apply_change("y", Position(350, 0), Position(350, 1))
    doc.apply_change("", Position(200, 0), Position(100, 0))  # a reversed range: lines 100-199 deleted
    assert doc.recent_rows == (100, 250)  # 150 was deleted with them: its area is where they were
    doc.apply_change("a\rb\r", Position(10, 0), Position(10, 0))  # lone CRs end lines too (LSP)
    assert doc.recent_rows == (10, 102, 252)
    doc.apply_change("z", Position(9999, 0), Position(9999, 0))  # past the end: clamped to the last line
    assert doc.recent_rows[0] == doc.line_count - 1


def test_a_file_opened_past_the_open_text_bound_is_not_kept_and_closing_makes_room():
    from memosight.server.documents import DocumentStore

    store = DocumentStore()
    store.MAX_OPEN_BYTES = 100 * 32
    assert store.open("file:///a.py", "a" * 60, "python", 1) is not None
    assert store.open("file:///b.py", "b" * 60, "python", 1) is None and store.get("file:///b.py") is None
    assert store.open_bytes() == 60 * 32
    store.close("file:///a.py")
    assert store.open("file:///b.py", "b" * 60, "python", 1) is not None
