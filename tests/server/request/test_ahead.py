import asyncio

from memosight.server.config import Settings
from memosight.server.documents import Document
from memosight.server.request.records import Ticket
from memosight.server.request.suggest import Suggester


def test_a_warm_up_prefills_the_prompt_and_a_newer_edit_stops_the_older(scripted_engine):
    engine = scripted_engine("x")
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(x):\n    return x\n", "python", 1)
    settings = Settings(prefetch=False)
    suggester.ensure_engine(settings).result(timeout=10)
    suggester.ahead.warm(doc, 10, settings)
    suggester.engine.submit(lambda: None).result(timeout=10)  # the engine thread got to it
    assert len(engine.prefills) == 1 and engine.prefills[0].prefix.endswith("def f(x):\n")
    assert suggester.counters.warm_ups == 1
    suggester.ahead.warm(doc, 10, Settings(prefill_on_edit=False))  # off: the pending one stops, none starts
    assert not suggester.ahead.holds(doc.uri) and engine.prefills[0].cancel.is_set()
    suggester.close()


def test_a_prefetch_lands_in_the_completion_cache_and_closing_the_document_drops_it(scripted_engine):
    engine = scripted_engine("y = 1", repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "x = 1\n\n", "python", 1)
    settings = Settings()

    async def scenario():
        return await suggester.suggest(Ticket.of(doc, 6), settings)

    answer = asyncio.run(scenario())
    assert answer.suggestion.text == "y = 1"
    suggester.engine.submit(lambda: None).result(timeout=10)  # the prefetch ran after the answer
    assert suggester.counters.prefetched == 1
    assert suggester.completions.has(doc.uri, "x = 1\ny = 1\n", len("x = 1\ny = 1"))
    suggester.forget(doc.uri)
    assert not suggester.ahead.holds(doc.uri) and not suggester.completions.has_document(doc.uri)
    suggester.close()


def test_a_request_stops_the_warm_ups_of_other_text_but_not_the_one_computing_its_own_prompt(scripted_engine):
    engine = scripted_engine("x")
    suggester = Suggester(lambda settings: engine)
    settings = Settings(prefetch=False)
    suggester.ensure_engine(settings).result(timeout=10)
    doc, other = (Document(f"file:///{name}.py", "def f(x):\n    return x\n", "python", 1) for name in "ab")
    suggester.ahead.warm(doc, 10, settings)
    suggester.ahead.warm(other, 10, settings)
    suggester.engine.submit(lambda: None).result(timeout=10)
    suggester.ahead.stop_warm_ups(keep=Ticket.of(doc, 10))  # a request at the warm-up's very text and cursor
    assert [p.cancel.is_set() for p in engine.prefills] == [False, True]  # the other document's stopped
    suggester.ahead.stop_warm_ups(keep=Ticket.of(doc, 11))  # another cursor: its warm-up is not this prompt
    assert engine.prefills[0].cancel.is_set()
    suggester.close()


def test_a_pause_after_edits_asks_the_engine_to_refresh_and_the_next_edit_stops_it(scripted_engine, monkeypatch):
    import threading

    from memosight.server.request import ahead

    monkeypatch.setattr(ahead, "REFRESH_AFTER_S", 0.05)
    engine = scripted_engine("x")
    refreshing, stopped = threading.Event(), threading.Event()

    def refresh(cancel):  # a refresh that runs until the next edit stops it
        refreshing.set()
        stopped.set() if cancel.wait(5) else None
        return 0

    engine.refresh = refresh
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(x):\n    return x\n", "python", 1)
    settings = Settings(prefetch=False)
    suggester.ensure_engine(settings).result(timeout=10)
    for cursor in (10, 11, 12):  # keys: no pause between them
        suggester.ahead.warm(doc, cursor, settings)
    assert refreshing.wait(5) and suggester.counters.refreshes == 1  # one pause, one refresh
    suggester.ahead.warm(doc, 13, settings)  # the next key
    assert stopped.wait(5)
    suggester.close()
