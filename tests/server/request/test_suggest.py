import asyncio
import time
from pathlib import Path

import pytest
from memosight.engine.protocol import EngineInfo
from memosight.server.config import Settings
from memosight.server.documents import Document
from memosight.server.request.mode import SINGLE_LINE_MAX_TOKENS
from memosight.server.request.records import Ticket
from memosight.server.request.suggest import Suggester
from memosight.server.request.timeline import Timeline


async def suggest(suggester: Suggester, doc: Document, cursor: int, settings: Settings, **kwargs):
    """The suggestion (or None), checking that the request brought no message for the user."""
    answer = await suggester.suggest(Ticket.of(doc, cursor), settings, **kwargs)
    assert answer.messages == []
    return answer.suggestion


async def until(predicate, timeout: float = 5.0) -> None:
    """Wait until `predicate()` holds (the engine thread changes what it looks at)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("text, cursor, shared", [
    ("x = \n", 4, True),  # the same cursor, nothing typed: the running generation is still right
    ("x = \ny = \n", 10, False),  # the cursor moved: the running generation is useless
])
def test_a_newer_request_shares_or_supersedes_the_running_generation(scripted_engine, text, cursor, shared):
    engine = scripted_engine("abcdefgh", delay=0.15, repeat=False)  # still running when the newer one comes
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", text, "python")

    # slow tokens here: no time budget cuts the line; no prefetch adds an engine request
    settings = Settings(latency_budget_ms=0, prefetch=False)

    async def scenario():
        older = asyncio.ensure_future(suggest(suggester, doc, 4, settings))
        await until(engine.running.is_set)
        newer = await suggest(suggester, doc, cursor, settings)
        return await older, newer

    older, newer = asyncio.run(scenario())
    assert older is None and newer.text == "abcdefgh"  # never a stale suggestion for the older request
    assert suggester.counters.superseded == 1 and suggester.counters.completed == 1
    assert suggester.counters.joined == int(shared)
    assert len(engine.requests) == (1 if shared else 2)
    assert engine.requests[0].cancel.is_set() != shared


def test_partial_text_is_reported_while_generating(scripted_engine):
    suggester = Suggester(lambda settings: scripted_engine("abc", repeat=False))
    doc = Document("file:///a.py", "x = \n", "python")
    seen: list[str] = []

    async def scenario():
        result = await suggest(suggester, doc, 4, Settings(), on_partial=seen.append)
        await asyncio.sleep(0)  # let the loop run the partial callbacks
        return result

    assert asyncio.run(scenario()).text == "abc"
    assert seen == ["a", "ab", "abc"]
    assert suggester.counters.streamed == 1  # one request shown while written, not one per piece


def test_a_tab_on_streamed_text_before_the_answer_is_counted(scripted_engine):
    engine = scripted_engine("abcdefgh", delay=0.05, repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "x = \n", "python")
    settings = Settings(latency_budget_ms=0, prefetch=False)
    seen: list[str] = []

    async def scenario():
        request = asyncio.ensure_future(suggest(suggester, doc, 4, settings, on_partial=seen.append))
        await until(lambda: seen and len(seen[-1]) >= 3)
        suggester.record_accepted(3)  # the editor's Tab took "abc" while the rest was written
        accepted_then = suggester.counters.accepted
        await request
        return accepted_then

    assert asyncio.run(scenario()) == 1 and suggester.counters.accepted_chars == 3
    suggester.record_accepted(8)
    suggester.record_accepted(8)
    assert suggester.counters.accepted == 2  # no more than shown: one streamed, one answered


def test_typing_the_start_of_a_suggestion_is_answered_from_its_rest(scripted_engine):
    engine = scripted_engine("total += item", repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "for item in items:\n    \n", "python")
    cursor = doc.text.index("    \n") + 4

    settings = Settings(prefetch=False)  # the engine requests counted below are the user's only

    async def scenario():
        first = await suggest(suggester, doc, cursor, settings)
        doc.apply_change("tot", doc.position_at(cursor), doc.position_at(cursor))
        second = await suggest(suggester, doc, cursor + 3, settings)
        doc.apply_change("X", doc.position_at(cursor + 3), doc.position_at(cursor + 3))  # diverges
        third = await suggest(suggester, doc, cursor + 4, settings)
        return first, second, third

    first, second, third = asyncio.run(scenario())
    assert first.text == "total += item"
    assert second.text == "al += item" and second.stop_reason == "typed_through"
    assert len(engine.requests) == 2  # the second request made no model call; the third did
    assert third.text == "total += item"
    assert suggester.counters.typed_through == 1


def test_typing_along_an_earlier_completion_answers_from_it_though_another_came_since(scripted_engine):
    engine = scripted_engine(["total += item", "print(items)"], repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "for item in items:\n    \n\n", "python")
    inside, below = doc.text.index("    \n") + 4, len(doc.text) - 1
    settings = Settings(prefetch=False)

    async def scenario():
        first = await suggest(suggester, doc, inside, settings)
        other = await suggest(suggester, doc, below, settings)  # the last suggestion is now this one
        doc.apply_change("total", doc.position_at(inside), doc.position_at(inside))
        return first, other, await suggest(suggester, doc, inside + 5, settings)

    first, other, back = asyncio.run(scenario())
    assert (first.text, other.text) == ("total += item", "print(items)")
    assert back.text == " += item" and back.stop_reason == "typed_through" and len(engine.requests) == 2


def test_after_a_suggestion_the_one_that_follows_taking_it_is_prefetched(scripted_engine):
    engine = scripted_engine(["total = 0", "for x in xs:"], repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(xs):\n    \n", "python")
    cursor = doc.text.index("    \n") + 4

    async def scenario():
        first = await suggest(suggester, doc, cursor, Settings())
        await until(lambda: suggester.counters.prefetched == 1)
        doc.apply_change("total = 0", doc.position_at(cursor), doc.position_at(cursor))  # Tab
        return first, await suggest(suggester, doc, cursor + len("total = 0"), Settings())

    first, after_tab = asyncio.run(scenario())
    assert first.text == "total = 0"
    assert engine.requests[1].prefix.endswith("    total = 0")  # computed ahead, while the first was read
    assert after_tab.text == "for x in xs:" and after_tab.stop_reason == "typed_through"  # no model call for it
    assert suggester.completions.to_json()["prefetch_hits"] == 1


def test_a_request_after_tab_joins_the_prefetch_still_running(scripted_engine):
    engine = scripted_engine(["total = 0", "for x in xs:"], delay=0.06, repeat=False)  # the prefetch runs ~0.7 s
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(xs):\n    \n", "python")
    cursor = doc.text.index("    \n") + 4
    settings = Settings(latency_budget_ms=0)

    async def scenario():
        first = await suggest(suggester, doc, cursor, settings)
        await until(lambda: len(engine.requests) == 2 and engine.running.is_set())  # the prefetch runs
        doc.apply_change("total = 0", doc.position_at(cursor), doc.position_at(cursor))  # Tab
        suggester.warm(doc, cursor + len("total = 0"), settings)  # the edit: the prefetch goes on
        timeline = Timeline()
        after_tab = await suggest(suggester, doc, cursor + len("total = 0"), settings, timeline=timeline)
        prefetched = suggester.counters.prefetched  # before the next prefetch can finish
        await until(lambda: len(engine.requests) == 3)  # the next prefetch starts after the answer, not before
        return first, after_tab, timeline, prefetched

    first, after_tab, timeline, prefetched = asyncio.run(scenario())
    assert first.text == "total = 0" and after_tab.text == "for x in xs:"
    assert timeline.kind == "joined"  # no model call of its own: the prefetch's prompt is the only one there
    assert [r.prefix.endswith("total = 0") for r in engine.requests] == [False, True, False]  # then the next prefetch
    assert suggester.counters.joined == 1 and prefetched == 1
    suggester.close()


def test_an_edit_off_the_prefetch_stops_it(scripted_engine):
    engine = scripted_engine(["total = 0", "x" * 40], delay=0.03, repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(xs):\n    \n", "python")
    cursor = doc.text.index("    \n") + 4
    settings = Settings(latency_budget_ms=0, prefill_on_edit=False)

    async def scenario():
        await suggest(suggester, doc, cursor, settings)
        await until(lambda: len(engine.requests) == 2 and engine.running.is_set())
        doc.apply_change("y", doc.position_at(cursor), doc.position_at(cursor))  # not the suggestion
        suggester.warm(doc, cursor + 1, settings)

    asyncio.run(scenario())
    assert engine.requests[1].cancel.is_set() and not suggester.ahead.holds(doc.uri)
    suggester.close()


def test_completions_are_forgotten_when_the_settings_change(scripted_engine):
    engine = scripted_engine(["xxxxxxxx", "yyy"], repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "x = \n", "python")
    first = asyncio.run(suggest(suggester, doc, 4, Settings(prefetch=False)))
    again = asyncio.run(suggest(suggester, doc, 4, Settings(prefetch=False)))
    changed = asyncio.run(suggest(suggester, doc, 4, Settings(prefetch=False, max_new_tokens=3)))
    assert first.text == again.text == "xxxxxxxx" and len(engine.requests) == 2 and changed.text == "yyy"


def test_a_running_generation_that_still_matches_is_joined_not_restarted(scripted_engine):
    engine = scripted_engine("abcdefghij", delay=0.15, repeat=False)  # still running when the newer one comes
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "x = \n", "python")

    # slow tokens here: no time budget cuts the line; no prefetch adds an engine request
    settings = Settings(latency_budget_ms=0, prefetch=False)

    async def scenario():
        older = asyncio.ensure_future(suggest(suggester, doc, 4, settings))
        await until(lambda: engine.emitted >= 3)  # a few characters are out
        doc.apply_change("a", doc.position_at(4), doc.position_at(4))
        newer = await suggest(suggester, doc, 5, settings)
        return await older, newer

    older, newer = asyncio.run(scenario())
    assert older is None  # no stale suggestion for the older request
    assert newer.text == "bcdefghij"
    assert len(engine.requests) == 1 and suggester.counters.joined == 1


def test_a_multi_line_run_shows_its_first_line_at_once_and_the_rest_after_tab(scripted_engine):
    body = "total = 0\n    for x in xs:\n        total += x\n    return total"
    engine = scripted_engine(body, delay=0.02, repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(xs):\n    \n", "python")
    cursor = doc.text.index("    \n") + 4
    # multi-line at an empty function body; no budget cuts the slow tokens; no prefetch request
    settings = Settings(latency_budget_ms=0, prefetch=False)

    async def scenario():
        first = await suggest(suggester, doc, cursor, settings)
        written_then = engine.emitted
        line = "total = 0\n    "
        doc.apply_change(line, doc.position_at(cursor), doc.position_at(cursor))  # Tab, Enter
        rest = await suggest(suggester, doc, cursor + len(line), settings)
        return first, written_then, rest

    first, written_then, rest = asyncio.run(scenario())
    assert first.text == "total = 0" and first.stop_reason == "first_line"
    assert written_then < len(body)  # answered while the model was still writing the block
    assert rest.text == "for x in xs:\n        total += x\n    return total"
    assert len(engine.requests) == 1 and suggester.counters.first_lines == 1  # one run served both


def test_a_one_line_run_is_answered_whole(scripted_engine):
    engine = scripted_engine("total = 0", repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "def f(xs):\n    \n", "python")
    cursor = doc.text.index("    \n") + 4
    answer = asyncio.run(suggest(suggester, doc, cursor, Settings(prefetch=False)))
    assert answer.text == "total = 0" and answer.stop_reason != "first_line"
    assert suggester.counters.first_lines == 0


def test_build_context_compresses_with_the_other_open_documents(scripted_engine):
    helper = Document("file:///pkg/util.py", "def far_helper(count, scale=3):\n    return count * scale\n", "python")
    filler = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(300))
    doc = Document("file:///pkg/main.py", filler + "def use(items):\n    n = far_helper(len(items))\n    ", "python")
    suggester = Suggester(open_documents=lambda: [doc, helper])
    packed = suggester.context.build(scripted_engine(), doc, len(doc.text), Settings(context_budget=128))
    assert packed.prompt_tokens <= 128
    assert "def far_helper(count, scale=3):" in packed.prefix and packed.prefix.endswith("far_helper(len(items))\n    ")
    alone = suggester.context.build(scripted_engine(), doc, len(doc.text), Settings(context_budget=128), others=[])
    assert "def far_helper(count" not in alone.prefix
    suggester.shutdown()


def test_a_model_without_fim_tokens_gets_the_whole_budget_before_the_cursor(scripted_engine):
    before = "def use(items):\n" + "".join(f"    n{i} = items[{i}] + {i}\n" for i in range(300)) + "    "
    after = "\n" + "".join(f"    m{i} = items[{i}] * {i}\n" for i in range(300))  # the same function goes on
    doc = Document("file:///pkg/main.py", before + after, "python")
    cursor = len(before)
    fim, plain = scripted_engine(), scripted_engine()
    plain.info = lambda: EngineInfo("plain", "cpu", "float32", has_fim=False)
    settings = Settings(context_budget=256, suffix_share=0.25)
    suggester = Suggester(open_documents=lambda: [doc])
    with_fim = suggester.context.build(fim, doc, cursor, settings)
    suggester.shutdown()
    suggester = Suggester(open_documents=lambda: [doc])  # its own compressor: the near window's start is kept
    without = suggester.context.build(plain, doc, cursor, settings)
    assert with_fim.suffix.strip() and not without.suffix.strip()  # nothing kept for a suffix it cannot see
    assert plain.count_tokens(without.prefix) > plain.count_tokens(with_fim.prefix)  # the budget went before it
    assert without.prompt_tokens <= 256
    suggester.shutdown()


def test_build_context_brings_definitions_from_unopened_workspace_files(tmp_path, scripted_engine):
    from memosight.server.context.workspace import WorkspaceIndex

    (tmp_path / "util.py").write_text("def far_helper(count, scale=3):\n    return count * scale\n")
    (tmp_path / "other.py").write_text("def unrelated():\n    pass\n")
    filler = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(300))
    doc = Document((tmp_path / "main.py").as_uri(), filler + "def use(items):\n    n = far_helper(len(items))\n    ",
                   "python")
    index = WorkspaceIndex(tmp_path)
    index.scan()
    suggester = Suggester(open_documents=lambda: [doc], workspace=lambda: index)
    packed = suggester.context.build(scripted_engine(), doc, len(doc.text), Settings(context_budget=128))
    assert packed.prompt_tokens <= 128
    assert "def far_helper(count, scale=3):" in packed.prefix and "unrelated" not in packed.prefix
    assert [Path(d.path).name for d in suggester.context.workspace_documents(doc, len(doc.text), [doc])] == ["util.py"]
    suggester.shutdown()


def test_workspace_files_are_chosen_for_names_not_defined_here_and_the_choice_sticks(tmp_path):
    from memosight.server.context.workspace import WorkspaceIndex

    (tmp_path / "a.py").write_text("def alpha():\n    pass\n\ndef local_name():\n    pass\n")
    (tmp_path / "b.py").write_text("def beta():\n    pass\n")
    index = WorkspaceIndex(tmp_path)
    index.scan()
    suggester = Suggester(workspace=lambda: index)

    def picks(text: str) -> list[str]:
        doc = Document((tmp_path / "main.py").as_uri(), text, "python")
        return [Path(d.path).name for d in suggester.context.workspace_documents(doc, len(text), [])]

    assert picks("def local_name():\n    pass\n\nlocal_name()\n") == []  # defined right here
    assert picks("x = alpha()\n") == ["a.py"]
    assert picks("x = alpha()\ny = 1\n") == ["a.py"]  # nothing new: the same files
    assert picks("x = alpha()\ny = 1\nbet") == ["a.py"]  # a name still being typed does not count
    assert sorted(picks("x = alpha()\ny = beta()\n")) == ["a.py", "b.py"]  # a new name moves it
    assert sorted(picks("x = alpha()\n")) == ["a.py", "b.py"]  # beta no longer used: the choice stays
    doc = Document((tmp_path / "main.py").as_uri(), "x = alpha()\n", "python")
    opened = Document((tmp_path / "b.py").as_uri(), "def beta():\n    return 2\n", "python")
    assert [Path(d.path).name for d in suggester.context.workspace_documents(doc, len(doc.text), [opened])] == ["a.py"]
    suggester.shutdown()


def test_build_context_falls_back_to_truncation_if_compression_fails(scripted_engine):
    suggester = Suggester()

    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    suggester.context.compressor.build = broken
    doc = Document("file:///a.py", "x = 1\ny = 2\n", "python")
    packed = suggester.context.build(scripted_engine(), doc, 6, Settings(context_budget=64))
    assert packed.prefix == "x = 1\n" and packed.suffix == "y = 2\n"
    suggester.shutdown()


def test_single_line_requests_ask_for_at_most_a_line_of_tokens(scripted_engine):
    engine = scripted_engine("x")
    suggester = Suggester(lambda settings: engine)
    mid_line = Document("file:///a.py", "def f(x):\n    return g(\n", "python")
    asyncio.run(suggest(suggester, mid_line, len("def f(x):\n    return g("), Settings(max_new_tokens=64, prefetch=False)))
    below_opener = Document("file:///b.py", "def f(x):\n    \n", "python")
    asyncio.run(suggest(suggester, below_opener, len("def f(x):\n    "), Settings(max_new_tokens=64, prefetch=False)))
    assert SINGLE_LINE_MAX_TOKENS < 64 and [r.max_new_tokens for r in engine.requests] == [SINGLE_LINE_MAX_TOKENS, 64]


def test_a_model_that_fails_to_load_is_reported_in_the_answer_and_the_defaults_used(scripted_engine):
    from memosight.engine import EngineError

    engine = scripted_engine("ok", repeat=False)

    def load(spec):
        if spec.model:
            raise EngineError(f"model folder {spec.model!r} does not exist")
        return engine

    suggester = Suggester(load)
    doc = Document("file:///a.py", "x = \n", "python")
    answer = asyncio.run(suggester.suggest(Ticket.of(doc, 4), Settings.of(model="/nope")))
    assert answer.suggestion.text == "ok"
    (message,) = answer.messages
    assert "'/nope' does not exist" in message and "default model" in message
    assert asyncio.run(suggester.suggest(Ticket.of(doc, 4), Settings.of(model="/nope"))).messages == []  # said once
    suggester.shutdown()
    assert engine.closed or _eventually_closed(engine)


def _eventually_closed(engine) -> bool:
    import time

    deadline = time.monotonic() + 5
    while not engine.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.closed


def test_a_request_whose_document_changed_before_it_ran_is_dropped(scripted_engine):
    engine = scripted_engine("abc", repeat=False)
    suggester = Suggester(lambda settings: engine)
    doc = Document("file:///a.py", "x = \n", "python")

    async def scenario():
        asyncio.run_coroutine_threadsafe  # noqa: B018 - the request waits for the engine thread
        pending = asyncio.ensure_future(suggester.suggest(Ticket.of(doc, 4), Settings()))
        await asyncio.sleep(0)  # the request has seen version 0 and is queued
        doc.apply_change("y", doc.position_at(4), doc.position_at(4))
        doc.version += 1
        return await pending

    answer = asyncio.run(scenario())
    assert answer.suggestion is None and answer.seen.text == "x = \n"
    assert engine.requests == []  # never reached the engine


def test_a_request_cancelled_while_the_engine_loads_leaves_no_run_holding_its_text(scripted_engine):
    import threading

    gate = threading.Event()

    async def run():
        suggester = Suggester(lambda spec: gate.wait(10) and scripted_engine())
        doc = Document("file:///a.py", "x = \n", "python")
        request = asyncio.ensure_future(suggest(suggester, doc, 4, Settings()))
        await until(lambda: len(suggester.runs) == 1)  # its run made, waiting for the engine
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert len(suggester.runs) == 0 and suggester._asking == {}
        gate.set()
        suggester.shutdown()
    asyncio.run(run())


def test_closing_a_document_drops_its_running_generation(scripted_engine):
    async def run():
        suggester = Suggester(lambda settings: scripted_engine(delay=0.01))
        doc = Document("file:///a.py", "x = \n", "python")
        request = asyncio.ensure_future(suggest(suggester, doc, 4, Settings()))
        await until(lambda: "file:///a.py" in suggester._asking)
        request.cancel()  # the editor cancels; the generation is still running
        suggester.forget(doc.uri)  # and the document is closed
        assert suggester._asking == {} and len(suggester.runs) == 0  # nothing holds its text any more
        suggester.shutdown()
    asyncio.run(run())


def test_a_bad_draft_model_costs_the_draft_only(scripted_engine):
    loaded = []

    def load(spec):
        if spec.draft_model:
            raise ValueError("draft model 'tiny' has another tokenizer than 'big'")
        loaded.append(spec.model)
        return scripted_engine()
    suggester = Suggester(load)
    suggester.ensure_engine(Settings.of(model="big", draft_model="tiny")).result(timeout=10)
    assert loaded == ["big"]  # the user's model, not the defaults
    assert any("without the draft model" in m for m in suggester.messages.waiting)
    suggester.shutdown()


def test_a_remote_backend_answers_through_the_same_suggester_and_a_dead_one_is_said_once():
    from memosight.server.config import Backend

    from ...engine.engines.test_remote import FakeServer

    server = FakeServer()
    server.pieces = ["items", "\n", "more"]
    settings = Settings.of(backend=Backend(kind="llamacpp", url=server.url(path=""), fallback="none",
                                           first_token_timeout_ms=5000), prefetch=False)  # the last request is the user's
    suggester = Suggester()
    doc = Document("file:///a.py", "for item in \n", "python")
    assert asyncio.run(suggest(suggester, doc, 12, settings)).text == "items"
    # the cursor's line apart from the lines above (none here), its trailing space healed
    assert server.requests[-1]["input_prefix"] == "" and server.requests[-1]["prompt"] == "for item in"
    assert suggester.status(settings)["backend"]["state"] == "ok"
    server.stop()
    doc = Document("file:///a.py", "for thing in \n", "python")  # not a context whose completion is cached
    first = asyncio.run(suggester.suggest(Ticket.of(doc, 13), settings))
    second = asyncio.run(suggester.suggest(Ticket.of(doc, 13), settings))
    assert first.suggestion is None and len(first.messages) == 1 and "cannot reach the server" in first.messages[0]
    assert second.suggestion is None and second.messages == []  # once an hour, not once a keystroke


def test_a_finished_run_is_freed_at_once_with_its_text_not_left_to_the_cyclic_collector(scripted_engine):
    import gc

    from memosight.server.request.records import Generation

    suggester = Suggester(lambda spec: scripted_engine("abc", repeat=False))
    doc = Document("file:///a.py", "x = \n", "python")
    settings = Settings(prefetch=False, prefill_on_edit=False)
    asyncio.run(suggest(suggester, doc, 4, settings))  # the engine loaded, the first run's garbage made
    gc.collect()
    gc.disable()  # what is left now is held by references, or in a cycle (a 20 MB text, for a large file)
    try:
        assert asyncio.run(suggest(suggester, doc, 4, Settings(prefetch=False, prefill_on_edit=False,
                                                               max_new_tokens=9))).text == "abc"
        suggester.engine.submit(lambda: None).result(timeout=10)
        assert [o for o in gc.get_objects() if type(o) is Generation] == []  # type(): no lazy module touched
    finally:
        gc.enable()
        suggester.close()
