import asyncio
from pathlib import Path

from memosight.server.config import Settings
from memosight.server.documents import Document
from memosight.server.suggest import Suggester, completion_mode, post_process


def mode_at(text: str, marker: str = "|", language: str = "python", multiline: str = "auto"):
    cursor = text.index(marker)
    doc = Document("file:///a.py", text.replace(marker, ""), language)
    return completion_mode(doc, cursor, Settings(multiline=multiline))


def test_mid_line_is_single_line_and_never_repeats_the_rest_of_the_line():
    rule, multiline = mode_at("print(ite|)\n")
    assert not multiline and rule.single_line and rule.suffix_line == ")"


def test_after_a_block_opener_is_multi_line_to_the_end_of_the_block():
    rule, multiline = mode_at("class A:\n    def f(self):|\n\n    def g(self):\n        pass\n")
    assert multiline and not rule.single_line
    assert rule.block_indent == 4
    assert rule.next_suffix_line == "    def g(self):"


def test_blank_line_below_an_opener_is_multi_line():
    _, multiline = mode_at("def f(x):\n    |\n")
    assert multiline


def test_braces_open_blocks_in_other_languages():
    _, multiline = mode_at("function f(x) {|\n}\n", language="javascript")
    assert multiline


def test_multiline_setting_overrides_auto():
    assert mode_at("def f(x):|\n", multiline="never")[1] is False
    assert mode_at("x = |\n", multiline="always")[1] is True


def test_post_process_trims_trailing_space():
    assert post_process("return x  \n\n", multiline=True) == "return x"
    assert post_process("a\nb", multiline=False) == "a"


class FakeEngine:
    """Stands in for the engine: emits a fixed text in pieces, slowly, honouring cancel."""

    def __init__(self, text: str, delay: float = 0.0):
        self.text, self.delay = text, delay

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def stream(self, request, result):
        import time

        from memosight.engine.request import Completion

        out = ""
        for ch in self.text:
            if request.cancel.is_set():
                break
            time.sleep(self.delay)
            out += ch
            yield ch
        result["completion"] = Completion(out, len(out), 1, 1.0, 1.0, "max_tokens")

    def status(self) -> dict:
        return {"model": "fake", "device": "cpu", "dtype": "float32"}


def test_a_newer_request_supersedes_the_running_one():
    suggester = Suggester(load_engine=lambda settings: FakeEngine("abcdefgh", delay=0.05))
    doc = Document("file:///a.py", "x = \n", "python")

    async def scenario():
        older = asyncio.ensure_future(suggester.suggest(doc, 4, Settings()))
        await asyncio.sleep(0.1)
        newer = await suggester.suggest(doc, 4, Settings())
        return await older, newer

    older, newer = asyncio.run(scenario())
    assert older is None and newer.text == "abcdefgh"
    assert suggester.counters.superseded == 1 and suggester.counters.completed == 1


def test_partial_text_is_reported_while_generating():
    suggester = Suggester(load_engine=lambda settings: FakeEngine("abc"))
    doc = Document("file:///a.py", "x = \n", "python")
    seen: list[str] = []

    async def scenario():
        result = await suggester.suggest(doc, 4, Settings(), on_partial=seen.append)
        await asyncio.sleep(0)  # let the loop run the partial callbacks
        return result

    assert asyncio.run(scenario()).text == "abc"
    assert seen == ["a", "ab", "abc"]


def counting_loader(text: str, calls: list, delay: float = 0.0):
    """An engine loader whose engine records every model call it is asked for."""

    def load(settings):
        engine = FakeEngine(text, delay)
        original = engine.stream

        def counting_stream(request, result):
            calls.append(request.prefix)
            yield from original(request, result)

        engine.stream = counting_stream
        return engine

    return load


def test_typing_the_start_of_a_suggestion_is_answered_from_its_rest():
    calls: list = []
    suggester = Suggester(load_engine=counting_loader("total += item", calls))
    doc = Document("file:///a.py", "for item in items:\n    \n", "python")
    cursor = doc.text.index("    \n") + 4

    async def scenario():
        first = await suggester.suggest(doc, cursor, Settings())
        doc.apply_change("tot", doc.position_at(cursor), doc.position_at(cursor))
        second = await suggester.suggest(doc, cursor + 3, Settings())
        doc.apply_change("X", doc.position_at(cursor + 3), doc.position_at(cursor + 3))  # diverges
        third = await suggester.suggest(doc, cursor + 4, Settings())
        return first, second, third

    first, second, third = asyncio.run(scenario())
    assert first.text == "total += item"
    assert second.text == "al += item" and second.stop_reason == "typed_through"
    assert len(calls) == 2  # the second request made no model call; the third did
    assert third.text == "total += item"
    assert suggester.counters.typed_through == 1


def test_a_running_generation_that_still_matches_is_joined_not_restarted():
    starts: list = []
    suggester = Suggester(load_engine=counting_loader("abcdefghij", starts, delay=0.03))
    doc = Document("file:///a.py", "x = \n", "python")

    async def scenario():
        older = asyncio.ensure_future(suggester.suggest(doc, 4, Settings()))
        await asyncio.sleep(0.12)  # a few characters are out
        doc.apply_change("a", doc.position_at(4), doc.position_at(4))
        newer = await suggester.suggest(doc, 5, Settings())
        return await older, newer

    older, newer = asyncio.run(scenario())
    assert older is None  # no stale suggestion for the older request
    assert newer.text == "bcdefghij"
    assert len(starts) == 1 and suggester.counters.joined == 1


def test_build_context_compresses_with_the_other_open_documents():
    helper = Document("file:///pkg/util.py", "def far_helper(count, scale=3):\n    return count * scale\n", "python")
    filler = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(300))
    doc = Document("file:///pkg/main.py", filler + "def use(items):\n    n = far_helper(len(items))\n    ", "python")
    suggester = Suggester()
    suggester.open_documents = lambda: [doc, helper]
    packed = suggester.build_context(FakeEngine(""), doc, len(doc.text), Settings(context_budget=128))
    assert packed.prompt_tokens <= 128
    assert "def far_helper(count, scale=3):" in packed.prefix and packed.prefix.endswith("far_helper(len(items))\n    ")
    alone = suggester.build_context(FakeEngine(""), doc, len(doc.text), Settings(context_budget=128), others=[])
    assert "def far_helper(count" not in alone.prefix
    suggester.shutdown()


def test_build_context_brings_definitions_from_unopened_workspace_files(tmp_path):
    from memosight.server.context.workspace import WorkspaceIndex

    (tmp_path / "util.py").write_text("def far_helper(count, scale=3):\n    return count * scale\n")
    (tmp_path / "other.py").write_text("def unrelated():\n    pass\n")
    filler = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(300))
    doc = Document((tmp_path / "main.py").as_uri(), filler + "def use(items):\n    n = far_helper(len(items))\n    ",
                   "python")
    suggester = Suggester()
    suggester.open_documents = lambda: [doc]
    suggester.workspace = WorkspaceIndex(tmp_path)
    suggester.workspace.scan()
    packed = suggester.build_context(FakeEngine(""), doc, len(doc.text), Settings(context_budget=128))
    assert packed.prompt_tokens <= 128
    assert "def far_helper(count, scale=3):" in packed.prefix and "unrelated" not in packed.prefix
    assert [Path(d.path).name for d in suggester.workspace_documents(doc, len(doc.text), [doc])] == ["util.py"]
    suggester.shutdown()


def test_workspace_files_are_chosen_for_names_not_defined_here_and_the_choice_sticks(tmp_path):
    from memosight.server.context.workspace import WorkspaceIndex

    (tmp_path / "a.py").write_text("def alpha():\n    pass\n\ndef local_name():\n    pass\n")
    (tmp_path / "b.py").write_text("def beta():\n    pass\n")
    suggester = Suggester()
    suggester.workspace = WorkspaceIndex(tmp_path)
    suggester.workspace.scan()

    def picks(text: str) -> list[str]:
        doc = Document((tmp_path / "main.py").as_uri(), text, "python")
        return [Path(d.path).name for d in suggester.workspace_documents(doc, len(text), [])]

    assert picks("def local_name():\n    pass\n\nlocal_name()\n") == []  # defined right here
    assert picks("x = alpha()\n") == ["a.py"]
    assert picks("x = alpha()\ny = 1\n") == ["a.py"]  # nothing new: the same files
    assert picks("x = alpha()\ny = 1\nbet") == ["a.py"]  # a name still being typed does not count
    assert sorted(picks("x = alpha()\ny = beta()\n")) == ["a.py", "b.py"]  # a new name moves it
    assert sorted(picks("x = alpha()\n")) == ["a.py", "b.py"]  # beta no longer used: the choice stays
    doc = Document((tmp_path / "main.py").as_uri(), "x = alpha()\n", "python")
    opened = Document((tmp_path / "b.py").as_uri(), "def beta():\n    return 2\n", "python")
    assert [Path(d.path).name for d in suggester.workspace_documents(doc, len(doc.text), [opened])] == ["a.py"]
    suggester.shutdown()


def test_build_context_falls_back_to_truncation_if_compression_fails():
    suggester = Suggester()

    def broken(*args, **kwargs):
        raise RuntimeError("bug")

    suggester.compressor.build = broken
    doc = Document("file:///a.py", "x = 1\ny = 2\n", "python")
    packed = suggester.build_context(FakeEngine(""), doc, 6, Settings(context_budget=64))
    assert packed.prefix == "x = 1\n" and packed.suffix == "y = 2\n"
    suggester.shutdown()


def test_multi_line_completions_carry_the_latency_budget():
    text = "def f(x):\n    \n"
    doc = Document("file:///a.py", text, "python")
    stop, multiline = completion_mode(doc, len("def f(x):\n    "), Settings(latency_budget_ms=90))
    assert multiline and stop.time_budget_ms == 90
    stop, multiline = completion_mode(doc, len("def f("), Settings(latency_budget_ms=90))
    assert not multiline and stop.single_line


def test_single_line_requests_ask_for_at_most_a_line_of_tokens():
    from memosight.server.suggest import SINGLE_LINE_MAX_TOKENS

    seen = []

    class Recording(FakeEngine):
        def stream(self, request, result):
            seen.append(request.max_new_tokens)
            yield from super().stream(request, result)

    suggester = Suggester(load_engine=lambda settings: Recording("x"))
    mid_line = Document("file:///a.py", "def f(x):\n    return g(\n", "python")
    asyncio.run(suggester.suggest(mid_line, len("def f(x):\n    return g("), Settings(max_new_tokens=64)))
    below_opener = Document("file:///b.py", "def f(x):\n    \n", "python")
    asyncio.run(suggester.suggest(below_opener, len("def f(x):\n    "), Settings(max_new_tokens=64)))
    assert SINGLE_LINE_MAX_TOKENS < 64 and seen == [SINGLE_LINE_MAX_TOKENS, 64]
