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
