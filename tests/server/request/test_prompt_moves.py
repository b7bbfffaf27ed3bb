"""Where a keystroke's prefill comes from: what was typed, the packed context moving, a new prompt."""

from memosight.server.request.prompt_moves import PromptMoves

HEAD = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        data = f"


def test_typing_at_the_cursor_is_typed_and_a_move_above_its_line_is_the_context():
    moves = PromptMoves()
    assert moves.move("a.py", HEAD) == "new"  # the first prompt
    assert moves.move("a.py", HEAD + ".re") == "typed"
    assert moves.move("a.py", HEAD + ".read()\n        ") == "typed"  # a newline and indentation
    assert moves.move("a.py", HEAD + ".read()\n") == "typed"  # a backspace over the indentation
    assert moves.move("a.py", HEAD + ".read(") == "typed"  # ... and back over the newline
    assert moves.move("a.py", "# a far part re-chosen\n" + HEAD + ".read(") == "context"
    assert moves.move("b.py", HEAD) == "new"  # another document


def test_a_request_counts_what_the_warm_ups_before_it_prefilled_and_their_worst_move():
    moves = PromptMoves()
    moves.move("a.py", HEAD)
    moves.warmed("a.py", moves.move("a.py", "x = 1\n" + HEAD), 120)  # the context moved at an edit
    moves.warmed("a.py", moves.move("a.py", "x = 1\n" + HEAD + "."), 3)
    assert moves.for_request("a.py", moves.move("a.py", "x = 1\n" + HEAD + ".")) == (123, "context")
    assert moves.for_request("a.py", moves.move("a.py", "x = 1\n" + HEAD + ".r")) == (0, "typed")  # counted once
