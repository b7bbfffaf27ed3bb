"""The fuzz run's checks (fuzz_checks.py): an item built on another version than its request's, answers
tallied against the document as each request saw it, acceptances bounded, the memory report at the
peak, leaving cleanly."""

from memosight.server.bench.fuzz_checks import (
    AnswerTally,
    MemoryWatch,
    acceptances_bounded,
    built_on_another_version,
    left_cleanly,
)
from memosight.server.bench.fuzz_stream import COMPLETION, INLINE, Asked


def answer(result=None, error=None, msg_id=1) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, **({"error": error} if error else {"result": result})}


def completion_item(new_text: str, start: int, end: int) -> dict:
    return {"label": new_text, "textEdit": {"range": {"start": {"line": 0, "character": start},
                                                      "end": {"line": 0, "character": end}}, "newText": new_text}}


def test_the_tally_counts_not_open_content_modified_and_items_built_on_another_version():
    tally = AnswerTally()
    asked = Asked(COMPLETION, "file:///a.py", 11, "cl", (0, 2), sent_at=10.0)
    tally.add(asked, answer(error={"code": -32602, "message": "document file:///a.py is not open: send didOpen"}), 10.5)
    tally.add(asked, answer(error={"code": -32801, "message": "Content modified"}), 10.1)
    tally.add(asked, answer(error={"code": -32800, "message": "Request cancelled"}), 10.1)
    tally.add(asked, answer({"isIncomplete": True, "items": [completion_item("cß.data[key]", 0, 2)]}), 10.2)
    tally.add(asked, answer({"isIncomplete": True, "items": [completion_item("cl.data[key]", 0, 2)]}), 10.2)
    tally.add(asked, answer({"isIncomplete": True, "items": []}), 10.2)
    # an inline answer has no range to check
    tally.add(Asked(INLINE, "file:///a.py", 11, "cl", (0, 2), sent_at=10.0), answer({"items": [{"insertText": "x"}]}), 10.3)
    out = tally.to_json()
    assert (out["not_open"], out["content_modified"], out["other_errors"]) == (1, 1, {"-32800": 1})
    assert (out["items_checked"], out["built_on_another_version"]) == (2, 1)
    (wrong,) = out["examples"]["built on another version"]
    assert wrong["version"] == 11 and wrong["text_before_cursor"] == "cl" and wrong["answer"]["label"] == "cß.data[key]"
    assert out["latency_ms"]["count"] == 7 and out["latency_ms"]["max"] == 500.0


def test_acceptances_are_bounded_by_what_was_answered():
    assert acceptances_bounded({"completed": 3, "accepted": 3, "accepted_chars": 3 * 2048})
    assert not acceptances_bounded({"completed": 3, "accepted": 4, "accepted_chars": 10})
    assert not acceptances_bounded({"completed": 3, "accepted": 1, "accepted_chars": 4 * 10**30})
    assert acceptances_bounded({"completed": 3, "streamed": 1, "accepted": 4, "accepted_chars": 10})  # a Tab on streamed text


def test_the_memory_watch_keeps_the_report_at_the_highest_rss_and_every_reports_bound():
    watch = MemoryWatch()
    assert not watch.bounded()  # no report: nothing shows it
    for rss, accepted in ((400.0, 0), (650.5, 1), (500.0, 2)):
        watch.add({"requests": {"completed": 2, "accepted": accepted, "accepted_chars": 0},
                   "memory": {"rss_mb": rss, "documents": {"open": int(rss)}}})
    assert watch.at_peak == {"rss_mb": 650.5, "documents": {"open": 650}} and watch.reports == 3
    assert watch.bounded() and watch.counters == {"completed": 2, "accepted": 2, "accepted_chars": 0}
    watch.add({"requests": {"completed": 2, "accepted": 3, "accepted_chars": 0}})  # no memory report: an older server
    assert not watch.bounded() and watch.at_peak["rss_mb"] == 650.5


def test_a_server_that_left_by_a_signal_did_not_leave_cleanly():
    assert left_cleanly(0) and left_cleanly(1)
    assert not left_cleanly(-6) and not left_cleanly(None)


def test_an_item_built_on_the_text_after_an_edit_behind_the_request_is_flagged():
    # `cl|` at version 11; the user then deleted `l` and typed `ß` (version 12)
    asked = Asked(COMPLETION, "file:///a.py", 11, "cl", (0, 2))

    def item(new_text, start=(0, 0), end=(0, 2)):
        return {"textEdit": {"range": {"start": {"line": start[0], "character": start[1]},
                                       "end": {"line": end[0], "character": end[1]}}, "newText": new_text}}

    assert built_on_another_version(asked, item("cß.data[key]"))
    assert not built_on_another_version(asked, item("cl.data[key]"))
    assert built_on_another_version(asked, item("cl.data[key]", end=(0, 1)))  # not at the request's cursor
    assert built_on_another_version(asked, item("l.data", start=(0, 1)))  # not the whole word before it
    assert not built_on_another_version(asked, {"label": "x"})  # no range: nothing to check
    assert built_on_another_version(asked, {"textEdit": {"newText": "x"}})  # a range nobody can place
    assert built_on_another_version(asked, item("cl", start=("a", 0)))


def test_the_word_before_the_cursor_is_counted_in_utf16_units():
    asked = Asked(COMPLETION, "file:///a.py", 3, "😀 größ = 1\n", (0, 7))  # 😀 is two units
    edit = {"range": {"start": {"line": 0, "character": 3}, "end": {"line": 0, "character": 7}}, "newText": "größe"}
    assert not built_on_another_version(asked, {"textEdit": edit})
    edit["range"]["start"]["character"] = 2
    assert built_on_another_version(asked, {"textEdit": edit})
