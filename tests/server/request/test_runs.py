"""Runs: one model run per document, which a request joins only when the user typed along it."""

from concurrent.futures import Future

from memosight.server.config import Settings
from memosight.server.context.service import ContextService
from memosight.server.documents import Document
from memosight.server.request.completion_cache import CompletionCache
from memosight.server.request.engine_choice import EngineHolder
from memosight.server.request.records import Counters, Ticket
from memosight.server.request.runs import Runs, finished_lines


def runs() -> Runs:
    return Runs(EngineHolder(lambda spec: None, None), ContextService(), CompletionCache(), Counters(), print)


def running(gen, partial: str = "") -> None:
    """As if the engine thread had it: submitted and not done, `partial` written so far."""
    gen.future, gen.partial = Future(), partial


def test_a_request_joins_the_run_it_typed_along_and_no_other():
    r, settings = runs(), Settings()
    doc = Document("file:///a.py", "x = \n", "python")
    gen = r.start(Ticket.of(doc, 4), settings)
    assert r.joinable(doc.uri, doc.text, 4, settings) is None  # not given to the engine yet
    running(gen, "foo(")
    assert r.joinable(doc.uri, "x = fo\n", 6, settings) is gen  # typed along what it wrote
    assert r.joinable(doc.uri, "x = fx\n", 6, settings) is None  # typed off it
    assert r.joinable(doc.uri, "x = fo\n", 6, Settings(max_new_tokens=5)) is None  # other settings
    assert r.joinable(doc.uri, "y = \n", 4, settings) is None  # another text
    gen.future.set_result(None)
    assert r.joinable(doc.uri, doc.text, 4, settings) is None  # done: its completion is in the cache


def test_a_prefetch_is_joined_only_at_its_very_text_and_an_edit_elsewhere_stops_it():
    r, settings = runs(), Settings()
    taken = Document("file:///a.py", "x = 1\n\n", "python")  # the suggestion "1" taken
    gen = r.start(Ticket.of(taken, 5), settings, source="prefetch")
    running(gen, "\ny")
    assert r.joinable(taken.uri, taken.text, 5, settings) is gen  # the request after Tab
    assert r.joinable(taken.uri, "x = 1\n\n\n", 6, settings) is None  # typed past it: its guess is stale
    r.stop_prefetch_unless_at(taken.uri, taken.text, 5)  # the Tab's own edit keeps it
    assert not gen.cancel.is_set()
    r.stop_prefetch_unless_at(taken.uri, "x = 12\n\n", 6)
    assert gen.cancel.is_set() and not r.running(taken.uri)


def test_a_new_run_stops_the_one_before_and_a_typed_through_answer_stops_only_a_requests():
    r, settings = runs(), Settings()
    doc = Document("file:///a.py", "x = \n", "python")
    prefetch = r.start(Ticket.of(doc, 4), settings, source="prefetch")
    r.stop(doc.uri, source="request")  # typing through a cached completion: the prefetch goes on
    assert not prefetch.cancel.is_set() and r.running(doc.uri, source="prefetch")
    request = r.start(Ticket.of(doc, 4), settings)
    assert prefetch.cancel.is_set() and r.running(doc.uri, source="request")
    r.drop_unstarted(doc.uri, request)  # its request left before the engine got it
    assert request.cancel.is_set() and len(r) == 0


def test_a_runs_first_answer_is_its_finished_lines_without_trailing_blanks():
    assert finished_lines("a = 1  \n  b") == "a = 1"
    assert finished_lines("a = 1") == ""
