"""The language server's handlers, driven by pytest-lsp's client against the real server in this
process, with the scripted test engine behind the engine protocol (see conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest
from lsprotocol import types

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef main():\n    print(add(1, 2))\n"


def open_doc(client, path: Path, text: str = SOURCE, language: str = "python") -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))
    return uri


async def inline(client, uri: str, line: int, character: int):
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(line, character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


async def eventually(predicate, timeout: float = 5.0) -> None:
    """Wait until `predicate()` holds (state that another task or thread changes)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_initialize_advertises_inline_completion_and_the_accept_command(tmp_path, lsp_session):
    async with lsp_session(tmp_path) as client:
        caps = client.initialize_result.capabilities
        assert caps.inline_completion_provider is not None
        assert caps.completion_provider is not None
        assert "memosight.accepted" in caps.execute_command_provider.commands
        assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental


async def test_inline_completion_after_incremental_edits_reaches_the_engine(tmp_path, lsp_session):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 8}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(5, 20), types.Position(5, 20)), text="\n    ret")]))
        result = await inline(client, uri, 6, 7)
        (item,) = result.items
        assert item.insert_text == "x" * 8 and item.range is None  # inserted at the cursor
        assert item.command.command == "memosight.accepted"
        (request,) = client.engine.requests
        assert request.prefix.endswith("print(add(1, 2))\n    ret") and request.language == "python"
        assert request.stop.single_line and request.max_new_tokens == 8


async def test_completion_fallback_returns_the_same_suggestion(tmp_path, lsp_session):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 6}) as client:
        uri = open_doc(client, tmp_path / "a.py", "value = pri")
        result = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(0, 11)))
        (item,) = result.items
        # The item replaces the word before the cursor, so clients that filter on it keep it.
        assert item.text_edit.new_text == "pri" + "x" * 6
        assert item.text_edit.range.start == types.Position(0, 8)
        assert item.text_edit.range.end == types.Position(0, 11)


async def test_utf16_positions_with_emoji_cjk_and_crlf(tmp_path, lsp_session):
    text = "s = '😀中文'\r\nt = s\r\n"
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "u.py", text)
        # Replace 中 (UTF-16 column 7: ' is at 4, the emoji takes 2 units) by 日.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(0, 7), types.Position(0, 8)), text="日")]))
        # The completion item replaces the word before the cursor: its range shows where the server
        # thinks the cursor and the word are, in UTF-16 units, after the edit.
        result = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(0, 9)))
        edit = result.items[0].text_edit
        assert edit.new_text == "日文xxxx"
        assert (edit.range.start, edit.range.end) == (types.Position(0, 7), types.Position(0, 9))


async def test_newer_request_supersedes_the_older(tmp_path, lsp_session, scripted_engine, lsp_status):
    engine = scripted_engine("x", delay=0.02)  # 2 s: still running when the newer request comes
    options = {"max_new_tokens": 100, "multiline": "always"}  # a single line would stop at 32 tokens
    async with lsp_session(tmp_path, engine, init_options=options) as client:
        uri = open_doc(client, tmp_path / "a.py")
        older = asyncio.ensure_future(inline(client, uri, 1, 4))
        assert await asyncio.to_thread(engine.running.wait, 5)  # the older one is generating
        newer = await inline(client, uri, 1, 3)  # the cursor moved: the running generation is useless
        assert not (await older).items  # superseded: no stale suggestion
        assert newer.items and len(newer.items[0].insert_text) == 100
        assert engine.requests[0].cancel.is_set() and not engine.requests[1].cancel.is_set()
        assert (await lsp_status(client))["requests"]["superseded"] == 1


async def test_clients_that_ask_get_the_text_while_it_is_generated(tmp_path, lsp_session, scripted_engine):
    capabilities = types.ClientCapabilities(experimental={"memosight": {"partialCompletion": True}})
    async with lsp_session(tmp_path, scripted_engine("abc", repeat=False), capabilities=capabilities) as client:
        partials = []
        client.feature("memosight/partialCompletion")(lambda params: partials.append(params.text))
        uri = open_doc(client, tmp_path / "a.py", "x = \n")
        result = await inline(client, uri, 0, 4)
        assert result.items[0].insert_text == "abc"
        await eventually(lambda: partials and partials[-1] == "abc")
        assert partials == ["a", "ab", "abc"]


async def test_settings_reach_the_engine_through_configure(tmp_path, lsp_session):
    async with lsp_session(tmp_path, init_options={"speculative": False, "kv_cache_mb": 8}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)
        await inline(client, uri, 0, 3)
        assert {(s.speculative, s.kv_cache_bytes) for s in client.engine.settings} == {(False, 8 * 2**20)}
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"memosight": {"speculative": True}}))
        await inline(client, uri, 1, 4)
        assert client.engine.settings[-1].speculative is True  # changed without a reload


async def test_an_engine_that_fails_is_reported_and_the_server_keeps_answering(tmp_path, lsp_session,
                                                                               scripted_engine, lsp_status):
    class Failing(scripted_engine):
        def stream(self, request):
            raise RuntimeError("the model ran out of memory")

    async with lsp_session(tmp_path, Failing()) as client:
        uri = open_doc(client, tmp_path / "a.py")
        assert not (await inline(client, uri, 1, 4)).items
        assert not (await inline(client, uri, 1, 4)).items
        messages = [m.message for m in client.messages if "ran out of memory" in m.message]
        assert len(messages) == 1  # reported once, not once per request
        info = await lsp_status(client)
        assert info["requests"]["errors"] == 2 and info["state"] == "ready"


async def test_invalid_config_value_is_reported_and_the_default_kept(tmp_path, lsp_session):
    (tmp_path / ".memosight.toml").write_text('max_new_tokens = "lots"\nmultline = "auto"\nmultiline = "always"\n')
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "a.py")
        result = await inline(client, uri, 1, 4)
        assert result.items and len(result.items[0].insert_text) == 64  # the default max_new_tokens
        messages = " | ".join(m.message for m in client.messages)
        assert "`max_new_tokens`" in messages and "whole number" in messages
        assert "`multline`" in messages and "unknown key" in messages


async def test_config_file_is_reloaded_when_it_changes(tmp_path, lsp_session):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.memosight]\nmax_new_tokens = 3\n")
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "a.py")
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxx"
        config.write_text("[tool.memosight]\nmax_new_tokens = 5\n")
        os.utime(config, (time.time() + 5, time.time() + 5))
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxxxx"


async def test_editor_settings_override_the_config_file(tmp_path, lsp_session):
    (tmp_path / ".memosight.toml").write_text("max_new_tokens = 3\n")
    async with lsp_session(tmp_path, client_settings={"maxNewTokens": 7}) as client:
        # initialized -> workspace/configuration round trip
        await eventually(lambda: client.server.settings.max_new_tokens == 7)
        uri = open_doc(client, tmp_path / "a.py")
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "x" * 7


async def test_typing_into_a_suggestion_is_answered_without_the_engine(tmp_path, lsp_session, scripted_engine):
    async with lsp_session(tmp_path, scripted_engine("total += 1", repeat=False)) as client:
        uri = open_doc(client, tmp_path / "a.py", "x = 0\n")
        assert (await inline(client, uri, 1, 0)).items[0].insert_text == "total += 1"
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(1, 0), types.Position(1, 0)), text="tot")]))
        assert (await inline(client, uri, 1, 3)).items[0].insert_text == "al += 1"
        assert len(client.engine.requests) == 1
        # Closing the document forgets what was shown there.
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        uri = open_doc(client, tmp_path / "a.py", "x = 0\ntot")
        await inline(client, uri, 1, 3)
        assert len(client.engine.requests) == 2


async def test_the_workspace_is_indexed_and_saved_files_reindexed(tmp_path, lsp_session, lsp_status):
    (tmp_path / "util.py").write_text("def helper():\n    pass\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "skip.py").write_text("def vendored():\n    pass\n")
    async with lsp_session(tmp_path) as client:
        assert await asyncio.to_thread(client.server.workspace_index.ready.wait, 10)
        assert (await lsp_status(client))["workspace"] == {"root": str(tmp_path), "files": 1, "indexed": True}
        created = tmp_path / "new.py"
        created.write_text("def made_later():\n    pass\n")
        client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(created.as_uri())))
        await eventually(lambda: len(client.server.workspace_index) == 2)
        assert (await lsp_status(client))["workspace"]["files"] == 2


async def test_clients_that_can_are_asked_to_watch_source_and_config_files(tmp_path, lsp_session):
    capabilities = types.ClientCapabilities(workspace=types.WorkspaceClientCapabilities(
        did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)))
    registrations: list = []
    async with lsp_session(tmp_path, capabilities=capabilities) as client:
        client.feature(types.CLIENT_REGISTER_CAPABILITY)(
            lambda params: registrations.extend(params.registrations))
        await eventually(lambda: registrations)
        (registration,) = registrations
        assert registration.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES
        globs = [w["globPattern"] for w in registration.register_options["watchers"]]  # untyped JSON here
        assert "**/*.py" in globs and "**/*.ts" in globs and "**/.memosight.toml" in globs
        assert await asyncio.to_thread(client.server.workspace_index.ready.wait, 10)
        created = tmp_path / "made_outside.py"
        created.write_text("def from_a_checkout():\n    pass\n")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=created.as_uri(), type=types.FileChangeType.Created)]))
        await eventually(lambda: len(client.server.workspace_index) == 1)


async def test_bad_requests_get_clear_answers_and_the_server_stays_up(tmp_path, lsp_session, lsp_status):
    # a language id nobody knows, asked for: answered like any other
    options = {"max_new_tokens": 3, "languages": ["python", "no-such-language", "plaintext"]}
    async with lsp_session(tmp_path, init_options=options) as client:
        with pytest.raises(Exception, match="not open"):
            await inline(client, (tmp_path / "never-opened.py").as_uri(), 0, 0)
        uri = open_doc(client, tmp_path / "a.py", "x = 1\n", language="no-such-language")
        past_end = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(99, 99)))
        assert past_end.items[0].text_edit.range.end == types.Position(1, 0)  # clamped to the end of the file
        past_line = await inline(client, uri, 0, 500)  # clamped to the end of the line
        assert past_line.items[0].insert_text == "xxx"
        binary = open_doc(client, tmp_path / "b.bin", "\x00\x01\x02binary", language="plaintext")
        assert not (await inline(client, binary, 0, 3)).items
        huge = open_doc(client, tmp_path / "huge.py", "x = 1\n" * (9 * 1024 * 1024 // 6))  # over the 8 MB limit
        assert not (await inline(client, huge, 3, 0)).items
        messages = " | ".join(m.message for m in client.messages)
        assert "binary" in messages and "8 MB limit" in messages
        assert (await lsp_status(client))["state"] == "ready"


async def test_an_edit_starts_the_prefill_of_the_prompt_at_its_end(tmp_path, lsp_session):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)  # the engine is loaded: warm-ups need one
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(5, 20), types.Position(5, 20)), text="\n    tot")]))
        await eventually(lambda: client.engine.prefills)
        (warm,) = client.engine.prefills
        assert warm.prefix.endswith("print(add(1, 2))\n    tot")  # the prompt a request there would get
        await inline(client, uri, 6, 7)
        assert not warm.cancel.is_set()  # it computed this very prompt: the request let it finish
        assert client.engine.requests[-1].prefix is warm.prefix  # and the context it had built
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"memosight": {"prefillOnEdit": False}}))
        await eventually(lambda: not client.server.settings.prefill_on_edit)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=3),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(6, 7), types.Position(6, 7)), text="al")]))
        await inline(client, uri, 6, 9)
        assert len(client.engine.prefills) == 1
        assert client.engine.requests[-1].prefix.endswith("    total")  # no warm-up here: built anew


async def test_entering_a_file_starts_the_prefill_of_the_prompt_at_the_users_line(tmp_path, lsp_session, lsp_status):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)  # the engine is loaded: warm-ups need one
        other = open_doc(client, tmp_path / "b.py", "import os\n\ndef walk(top):\n    for root in os.walk(top):\n")
        client.protocol.notify("memosight/visited", {"textDocument": {"uri": other}, "line": 2})  # left it
        await lsp_status(client)  # handled
        assert client.engine.prefills == []  # leaving a file warms nothing
        client.protocol.notify("memosight/visited", {"textDocument": {"uri": other}, "line": 3, "entered": True})
        await eventually(lambda: client.engine.prefills)
        (warm,) = client.engine.prefills
        assert warm.prefix.endswith("def walk(top):\n    for root in os.walk(top):")  # the end of the user's line
        status = await lsp_status(client)
        assert status["requests"]["warm_ups"] == 1 and list(status["recent_rows"].values()) == [[2]]  # not a visit


# --- issue 14: one bad file, setting or message never hurts the rest ------------------------------

def edit(client, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        [types.TextDocumentContentChangePartial(range=types.Range(types.Position(*start), types.Position(*end)),
                                                text=text)]))


async def test_a_form_feed_does_not_shift_edits_or_completion_ranges(tmp_path, lsp_session):
    text = "import os\n\x0c\nshort = 1\nvalue_of_something_long = compute_the_value(1, 2)\n"
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 2}) as client:
        uri = open_doc(client, tmp_path / "a.py", text)
        edit(client, uri, 2, (3, 30), (3, 30), "zqmarker")
        result = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(3, 38)))
        (item,) = result.items
        assert item.text_edit.range == types.Range(types.Position(3, 26), types.Position(3, 38))
        assert item.text_edit.new_text.startswith("compzqmarker")
        assert client.server.documents.get(uri).text == text.replace("compute", "compzqmarkerute")


async def test_a_deeply_nested_config_file_is_reported_and_completions_go_on(tmp_path, lsp_session):
    config = tmp_path / ".memosight.toml"
    config.write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxx"
        config.write_text("y = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")
        os.utime(config, (time.time() + 5, time.time() + 5))
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxx"
        assert any("nested too deeply" in m.message for m in client.messages)


@pytest.mark.parametrize("bad_uri", ["file:///tmp/a%00b.py", "file:///tmp/\ud800b.py"])
async def test_a_document_with_an_impossible_uri_costs_only_itself(tmp_path, lsp_session, lsp_status, bad_uri,
                                                                   caplog):
    (tmp_path / "lib.py").write_text("def helper():\n    return 2\n")
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        await asyncio.to_thread(client.server.workspace_index.ready.wait, 10)
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=bad_uri, language_id="python", version=1, text="x = helper()\n")))
        uri = open_doc(client, tmp_path / "a.py", "y = helper()\n")
        for target in (uri, bad_uri, uri):
            assert (await inline(client, target, 0, 12)).items[0].insert_text == "xxx"
        client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(bad_uri)))
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(bad_uri)))
        assert (await inline(client, uri, 0, 12)).items[0].insert_text == "xxx"
        info = await lsp_status(client)
        assert info["requests"]["errors"] == 0 and info["error"] is None
        assert "failed" not in caplog.text  # the context was compressed, not cut in a fallback


async def test_lone_surrogates_in_a_document_reach_the_engine_as_valid_text(tmp_path, lsp_session, lsp_status):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        uri = open_doc(client, tmp_path / "a.py", "s = '\ud800'\nt = '\udfff\ud83d'\nu = ")
        assert (await inline(client, uri, 2, 4)).items[0].insert_text == "xxx"
        prompt = client.engine.requests[-1].prefix
        prompt.encode("utf-8")  # strict: every engine's tokenizer takes it
        assert "s = '\ufffd'\nt = '\ufffd\ufffd'\nu = " in prompt
        assert (await lsp_status(client))["error"] is None


async def test_taking_a_suggestion_finds_the_next_one_computed_ahead(tmp_path, lsp_session, scripted_engine,
                                                                     lsp_status):
    engine = scripted_engine(["total = 0", "return total"], repeat=False)
    async with lsp_session(tmp_path, engine, init_options={"prefetch": True}) as client:
        uri = open_doc(client, tmp_path / "a.py", "def f():\n    \n")
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "total = 0"
        await eventually(lambda: len(engine.requests) == 2)  # the prefetch, while the first is read
        edit(client, uri, 2, (1, 4), (1, 4), "total = 0")  # Tab
        await eventually(lambda: client.server.suggester.counters.prefetched == 1)
        assert (await inline(client, uri, 1, 13)).items[0].insert_text == "return total"
        info = await lsp_status(client)
        assert info["completion_cache"]["prefetch_hits"] == 1 and info["requests"]["prefetched"] >= 1


async def test_a_large_open_file_is_no_context_for_others_and_read_by_window_itself(tmp_path, lsp_session):
    big_line = "big_table_entry = compute_something(1, 2, 3)  # generated\n"
    big_text = big_line * (2_000_000 // len(big_line))
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        big = open_doc(client, tmp_path / "big.py", big_text)
        small = open_doc(client, tmp_path / "small.py", "def main():\n    big_table_entry = 1\n    ret")
        assert (await inline(client, small, 2, 7)).items
        assert "generated" not in client.engine.requests[-1].prefix
        middle = big_text.count("\n") // 2
        edit(client, big, 2, (middle, 0), (middle, 0), "value = ")
        assert (await inline(client, big, middle, 8)).items
        request = client.engine.requests[-1]
        assert request.prefix.endswith("value = ") and len(request.prefix) < 300_000


async def test_a_log_level_setting_that_is_removed_goes_back_to_the_command_line_s(tmp_path, lsp_session):
    import logging
    logger = logging.getLogger("memosight")
    before = logger.level
    try:
        logger.setLevel("WARNING")  # as --log-level warning would
        async with lsp_session(tmp_path, client_settings={"logLevel": "debug"}) as client:
            await eventually(lambda: logger.level == logging.DEBUG)
            client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
                settings={"memosight": {"maxNewTokens": 4}}))
            await eventually(lambda: logger.level == logging.WARNING)
    finally:
        logger.setLevel(before)


async def test_closing_a_document_drops_what_the_suggester_kept_for_it(tmp_path, lsp_session):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)
        edit(client, uri, 2, (5, 20), (5, 20), "\n    x")
        suggester = client.server.suggester
        assert suggester.completions.has_document(uri)
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        await eventually(lambda: not suggester.completions.has_document(uri) and not suggester.ahead.holds(uri)
                         and uri not in suggester._asking)


async def test_after_an_engine_fault_mid_generation_the_next_completion_is_whole(tmp_path, lsp_session,
                                                                                  scripted_engine, lsp_status):
    from memosight.engine.engines.faults import FaultPlan, FaultyEngine

    engine = FaultyEngine(scripted_engine("hello", repeat=False), FaultPlan(raise_rate=1.0, raise_after=2))
    async with lsp_session(tmp_path, engine) as client:
        uri = open_doc(client, tmp_path / "a.py")
        assert not (await inline(client, uri, 1, 4)).items  # half a suggestion is no suggestion
        assert any("injected fault" in m.message for m in client.messages)
        engine.plan = FaultPlan()
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "hello"
        info = await lsp_status(client)
        assert info["faults"]["raised"] == 1 and info["requests"]["errors"] == 1


async def test_status_breaks_each_answered_request_down_into_stages_that_add_up(tmp_path, lsp_session,
                                                                              scripted_engine, lsp_status):
    async with lsp_session(tmp_path, scripted_engine("abc", delay=0.01), init_options={"max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        started = time.perf_counter()
        await inline(client, uri, 1, 4)
        client_ms = (time.perf_counter() - started) * 1000
        breakdown = (await lsp_status(client))["breakdown"]
        assert breakdown["requests"] == 1
        stages = breakdown["stages_ms"]
        for stage in ("queue", "handler", "engine_wait", "context", "decode", "post", "resume", "reply"):
            assert stage in stages, (stage, str(list(stages)))
        assert stages["decode"]["p50"] >= 40  # 4 tokens, 10 ms each
        total = breakdown["total_ms"]["p50"]
        assert sum(s["p50"] for s in stages.values()) == pytest.approx(total, rel=0.01)
        assert total <= client_ms


async def test_code_the_user_visited_in_another_file_becomes_context(tmp_path, lsp_session, lsp_status, caplog):
    caplog.set_level(logging.INFO, logger="memosight.server.lsp")
    functions = "".join(f"def helper_{i}(value):\n    return value * {i}\n\n\n" for i in range(200))
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 3}) as client:
        notes = open_doc(client, tmp_path / "notes.py", functions)
        main = open_doc(client, tmp_path / "main.py", "def main():\n    ret")
        assert (await inline(client, main, 1, 7)).items
        assert "helper_150" not in client.engine.requests[-1].prefix
        row = functions[:functions.index("def helper_150(")].count("\n")
        for bad in ({"line": 3}, {"textDocument": {"uri": notes}, "line": -1},
                    {"textDocument": {"uri": notes}, "line": "x"}, {"textDocument": {"uri": "file:///nope.py"}, "line": 1}):
            client.protocol.notify("memosight/visited", bad)  # ignored, and the bad field named
        client.protocol.notify("memosight/visited", {"textDocument": {"uri": notes}, "line": row})
        status = await lsp_status(client)  # the notifications have been handled
        assert list(status["recent_rows"].values()) == [[row]]  # the good one only (keys: the client's)
        ours = [r for r in caplog.records if r.name.startswith("memosight")]  # not the client's copy of them
        dropped = [r.message for r in ours if "memosight/visited message from the editor was malformed" in r.message]
        assert len(dropped) == 3
        assert "required field missing @ $.params.text_document" in dropped[0]
        assert "'line' must be >= 0: -1" in dropped[1] and "expected int @ $.params.line" in dropped[2]
        assert sum("which is not open" in r.message for r in ours) == 1
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=main, version=2),
            [types.TextDocumentContentChangePartial(range=types.Range(types.Position(1, 7), types.Position(1, 7)),
                                                    text="urn")]))
        assert (await inline(client, main, 1, 10)).items
        assert "def helper_150(value):" in client.engine.requests[-1].prefix


# --- issue 35: a backend that stops is said to the user ------------------------------------------

async def test_a_real_backend_stopped_mid_session_is_said_at_once_and_the_local_model_answers(
        tmp_path, lsp_session, lsp_status, embedded_gguf):
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is in the dev extras")
    import sys

    from memosight.engine.bench.llama_server import free_port
    from memosight.server.config import Backend, Settings
    from memosight.server.request.engine_choice import load

    from ..conftest import _serve

    url = f"http://127.0.0.1:{free_port()}/v1"
    process, log = _serve([sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf), "--port",
                           url.split(":")[2].split("/")[0], "--n_ctx", "2048", "--n_threads", "1"],
                          f"{url}/models", tmp_path / "llama-cpp-python.log")
    try:
        engine = load(Settings.of(backend=Backend(kind="openai", url=url, timeout_ms=20000,
                                               first_token_timeout_ms=20000)).engine)
        text = "def add(a, b):\n    return a + b\n\n\ndef main():\n    \n"
        async with lsp_session(tmp_path, engine, init_options={"max_new_tokens": 8}) as client:
            uri = open_doc(client, tmp_path / "a.py", text)
            await inline(client, uri, 5, 4)
            status = await lsp_status(client)
            assert status["backend"]["state"] == "ok" and status["backend"]["fallback_requests"] == 0
            process.terminate()
            process.wait(10)
            for version, typed in ((2, "pri"), (3, "nt(")):  # new text each time: no cached completion
                end = 4 + (3 if version == 3 else 0)
                client.text_document_did_change(types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    [types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(5, end), types.Position(5, end)), text=typed)]))
                await inline(client, uri, 5, end + 3)
                said = [m for m in client.messages if "cannot reach" in m.message]
                assert said, "the answer came before the message"  # said when the engine knew, not after
            assert len(said) == 1 and url in said[0].message and "local model answers meanwhile" in said[0].message
            assert said[0].type == types.MessageType.Error
            status = await lsp_status(client)
            assert status["backend"]["state"] == "unreachable" and status["backend"]["fallback_requests"] >= 1
            assert status["notices"]["unreachable"]["count"] >= 1
    finally:
        process.terminate()
        log.close()


# --- a request is answered for the document as it arrived (issue 41) ------------------------------

def _frames(*messages: dict) -> bytes:
    """Several messages in one write: the server reads them all before a request's task first runs."""
    import json

    out = b""
    for message in messages:
        body = json.dumps(message).encode()
        out += b"Content-Length: %d\r\n\r\n" % len(body) + body
    return out


def _did_change(uri: str, version: int, line: int, start: int, end: int, text: str) -> dict:
    return {"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
        "textDocument": {"uri": uri, "version": version},
        "contentChanges": [{"range": {"start": {"line": line, "character": start},
                                      "end": {"line": line, "character": end}}, "text": text}]}}


async def test_a_request_followed_at_once_by_didclose_is_not_answered_not_open(tmp_path, raw_client):
    from .conftest import ScriptedEngine

    client = raw_client(ScriptedEngine("x = 1"))
    await client.initialize(tmp_path)
    uri = (tmp_path / "a.py").as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": "def f():\n    \n"}})
    request = {"jsonrpc": "2.0", "id": 5, "method": "textDocument/inlineCompletion", "params": {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 2}}}
    close = {"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": uri}}}
    client.send_raw(_frames(request, close))
    answer = await client.answer(5)
    # it was open when it arrived: never "invalid params ... not open"; the close overtook it
    assert answer.get("error", {}).get("code") == -32801, answer
    assert "closed" in answer["error"]["message"]
    # a request that arrives after the close is told so
    later = await client.request(6, "textDocument/inlineCompletion", request["params"])
    assert later["error"]["code"] == -32602 and "not open" in later["error"]["message"]


async def test_a_completion_item_is_built_on_the_version_its_request_saw(tmp_path, raw_client):
    # The fuzz's case: a completion at `cl` (version 11), then the client deletes `l` and types `ß`.
    # The item must replace `cl` in version 11, never be built on `cß`.
    from .conftest import ScriptedEngine

    client = raw_client(ScriptedEngine(".data[key]", repeat=False))
    await client.initialize(tmp_path)
    uri = (tmp_path / "d.py").as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 11,
                                                            "text": "cl\n"}})
    params = {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 2}}
    first = await client.request(1, "textDocument/completion", params)
    (item,) = first["result"]["items"]
    assert item["textEdit"]["newText"] == "cl.data[key]"
    request = {"jsonrpc": "2.0", "id": 2, "method": "textDocument/completion", "params": params}
    client.send_raw(_frames(request, _did_change(uri, 12, 0, 1, 2, ""), _did_change(uri, 13, 0, 1, 1, "ß")))
    answer = await client.answer(2)
    for item in answer["result"]["items"]:  # answered from what was computed for version 11's text
        assert item["textEdit"]["newText"].startswith("cl"), item
        assert item["textEdit"]["range"] == {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 2}}
    assert answer["result"]["items"], "the completion computed for this very text is at hand"
    digest = (await client.request(3, "memosight/status", {"digests": True}))["result"]["digests"][uri]
    from memosight.server.documents import text_digest
    assert digest == text_digest("cß\n")  # and the edits were applied after it
