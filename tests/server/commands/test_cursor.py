"""FILE:LINE:COL arguments, documents read from disk, and the settings that apply to a file."""

from pathlib import Path

import pytest
from memosight.server.commands.common import CommandError
from memosight.server.commands.cursor import (
    Cursor,
    load_document,
    parse_cursor,
    settings_for,
)


def test_cursor_argument_is_one_based():
    cursor = parse_cursor("a/b.py:3:7")
    assert (cursor.path, cursor.line, cursor.column) == (Path("a/b.py"), 3, 7)
    assert parse_cursor("C:/x/b.py:1:1").path == Path("C:/x/b.py")  # a colon in the path is fine
    for bad in ("a.py:3", "a.py:0:1", "a.py:1:0", "a.py:x:1"):
        with pytest.raises(Exception, match="FILE:LINE:COL|1-based"):
            parse_cursor(bad)


def test_the_cursor_becomes_an_offset_clamped_to_the_line_and_the_file(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("ab\ncdef\n")
    doc, offset = load_document(Cursor(path, 2, 3))
    assert doc.language == "python" and doc.text[offset:] == "ef\n"
    assert load_document(Cursor(path, 1, 99))[1] == 2  # past the end of the line: its end
    assert load_document(Cursor(path, 9, 1))[1] == len(doc.text)  # past the last line: the end


def test_missing_and_binary_files_are_clear_errors(tmp_path):
    with pytest.raises(CommandError, match="is not a file"):
        load_document(Cursor(tmp_path / "nope.py", 1, 1))
    (tmp_path / "b.bin").write_bytes(b"\x00\x01binary")
    with pytest.raises(CommandError, match="looks binary"):
        load_document(Cursor(tmp_path / "b.bin", 1, 1))


def test_settings_come_from_the_nearest_config_file_then_the_command_line(tmp_path, capsys):
    (tmp_path / ".memosight.toml").write_text('max_new_tokens = 12\ncontext_budget = 256\nmultiline = "sometimes"\n')
    (tmp_path / "pkg").mkdir()
    settings = settings_for(tmp_path / "pkg" / "m.py", {"context_budget": 128, "model": None})
    assert settings.max_new_tokens == 12 and settings.context_budget == 128  # the command line wins
    assert settings.multiline == "auto"  # an invalid value keeps its default, and is said
    assert "`multiline`" in capsys.readouterr().err
