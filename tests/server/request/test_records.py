from memosight.server.documents import Document
from memosight.server.request.records import Ticket, rest_after, typed_into


def test_typed_into_is_what_was_typed_at_the_cursor_since_the_suggestion_was_made():
    before, after = "x = ", "\ny = 2\n"
    assert typed_into(before + after, len(before), "x = 12\ny = 2\n", len("x = 12")) == "12"
    assert typed_into(before + after, len(before), before + after, len(before)) == ""


def test_typed_into_is_none_for_any_other_change():
    before, after = "x = ", "\ny = 2\n"
    assert typed_into(before + after, len(before), "x = 1\ny = 3\n", len("x = 1")) is None  # an edit after the cursor
    assert typed_into(before + after, len(before), "z = 1\ny = 2\n", len("z = 1")) is None  # an edit before the point
    assert typed_into(before + after, len(before), "x =\ny = 2\n", len("x =")) is None  # a deletion
    assert typed_into(before + after, len(before), "x = 1\ny = 2\n", len("x = ")) is None  # the cursor moved back


def test_a_ticket_goes_stale_when_an_edit_arrives():
    doc = Document("file:///a.py", "x = 1\n", "python", 1)
    ticket = Ticket.of(doc, 5)
    assert not ticket.stale()
    doc.apply_change("2", doc.position_at(4), doc.position_at(5))
    doc.version = 2
    assert ticket.stale() and ticket.seen.text == "x = 1\n"


def test_rest_after_is_what_is_left_of_the_text_typed_along():
    assert rest_after("return x\n", "ret") == "urn x\n"
    assert rest_after("return x\n", "") == "return x\n"
    assert rest_after("return x\n", "rex") is None  # typed off it
    assert rest_after("return x\n", "return x\n") is None  # typed all of it: nothing to show


def test_rest_after_a_running_text_takes_typing_ahead_of_it_while_it_agrees():
    assert rest_after("ret", "return", running=True) == ""  # the run has not caught up yet
    assert rest_after("ret", "return") is None  # a finished text is over
    assert rest_after("rex", "return", running=True) is None  # it wrote something else
    assert rest_after("return", "ret", running=True) == "urn"


def test_typed_into_a_large_document_compares_around_the_cursor_without_copying_it():
    from memosight.server.documents import LARGE_DOCUMENT_CHARS

    old = "x = 1\n" * (LARGE_DOCUMENT_CHARS // 6 + 10)
    cursor = len(old) // 2
    typed = old[:cursor] + "ab" + old[cursor:]
    assert typed_into(old, cursor, typed, cursor + 2) == "ab"
    near = typed[:cursor - 3] + "y" + typed[cursor - 2:]  # an edit just before where the suggestion was made
    assert typed_into(old, cursor, near, cursor + 2) is None
    after = typed[:cursor + 5] + "z" + typed[cursor + 6:]  # an edit just after the cursor
    assert typed_into(old, cursor, after, cursor + 2) is None
