"""The near window: row offsets scanned from the cursor, the function around it, parse errors at it."""

from memosight.server.context.near import Rows, error_near, function_rows
from memosight.server.documents import Document


def test_row_offsets_found_from_the_cursor_match_the_whole_line_table():
    text = "".join(f"line {i}\n" for i in range(50)) + "last"
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    rows = Rows(text, text.index("line 25") + 3)
    assert rows.cursor_row == 25
    for row in [30, 10, 0, 49, 50, 26, 24]:
        assert rows.offset(row) == starts[row]
    assert rows.offset(60) == len(text)  # past the end: the end of the text


def test_the_function_around_the_cursor_and_an_error_at_it():
    text = "import os\n\n\n@cache\ndef f(x):\n    y = x\n\n    return y\n\n\nz = 1\n"
    doc = Document("file:///m.py", text, "python")
    cursor = text.index("y = x")
    assert function_rows("python", text, doc.tree, cursor, 5) == (3, 7)  # from its decorator
    assert function_rows("python", text, doc.tree, text.index("z = 1"), 10) == (None, None)
    end_of_last_line = text.index("return y") + len("return y")  # where one types a function's last line
    assert function_rows("python", text, doc.tree, end_of_last_line, 7) == (3, 7)
    assert function_rows("python", text, doc.tree, text.index("z = 1") + 5, 10) == (None, None)
    assert not error_near(doc.tree, text, cursor)
    broken = text.replace("y = x", "y = (x")
    assert error_near(Document("file:///b.py", broken, "python").tree, broken, broken.index("y = (x") + 5)
