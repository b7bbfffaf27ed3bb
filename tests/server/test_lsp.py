"""End to end over stdio: pytest-lsp starts the real `memosight-lsp --stdio` and talks to it."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig

SERVER = [sys.executable, "-m", "memosight.server", "--stdio"]
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef main():\n    print(add(1, 2))\n"


@asynccontextmanager
async def lsp_session(root: Path, init_options: dict | None = None, client_settings: dict | None = None):
    config = ClientServerConfig(server_command=SERVER, server_env={**os.environ, "HF_HUB_OFFLINE": "1"})
    client = await config.start(devtools=None)
    if client_settings is not None:
        client.set_configuration({"memosight": client_settings})
    capabilities = types.ClientCapabilities(
        workspace=types.WorkspaceClientCapabilities(configuration=client_settings is not None))
    result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri=root.as_uri(), initialization_options=init_options))
    client.initialize_result = result
    try:
        yield client
    finally:
        await client.shutdown_session()


def open_doc(client, path: Path, text: str = SOURCE, language: str = "python") -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))
    return uri


async def inline(client, uri: str, line: int, character: int):
    return await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(line, character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


async def status(client) -> dict:
    result = await client.protocol.send_request_async("memosight/status", {})
    return result if isinstance(result, dict) else _plain(result)


def _plain(obj):
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "_asdict"):  # pygls hands back untyped JSON objects as namedtuples
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    items = obj.items() if isinstance(obj, dict) else vars(obj).items()
    return {k: _plain(v) for k, v in items}


async def test_initialize_advertises_inline_completion_and_the_accept_command(tmp_path, repeater_model_dir):
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir)}) as client:
        caps = client.initialize_result.capabilities
        assert caps.inline_completion_provider is not None
        assert caps.completion_provider is not None
        assert "memosight.accepted" in caps.execute_command_provider.commands
        assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental


async def test_inline_completion_after_incremental_edits(tmp_path, repeater_model_dir):
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir), "max_new_tokens": 8}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        # Type " ret" at the start of a new line inside main(), one edit at a time, as an editor would.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(5, 20), types.Position(5, 20)), text="\n    ret")]))
        result = await inline(client, uri, 6, 7)
        assert len(result.items) == 1
        item = result.items[0]
        assert item.insert_text == "x" * 8
        assert item.range is None  # inserted at the cursor
        assert item.command.command == "memosight.accepted"


async def test_completion_fallback_returns_the_same_suggestion(tmp_path, repeater_model_dir):
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir), "max_new_tokens": 6}) as client:
        uri = open_doc(client, tmp_path / "a.py", "value = pri")
        result = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(0, 11)))
        (item,) = result.items
        # The item replaces the word before the cursor, so clients that filter on it keep it.
        assert item.text_edit.new_text == "pri" + "x" * 6
        assert item.text_edit.range.start == types.Position(0, 8)
        assert item.text_edit.range.end == types.Position(0, 11)


async def test_utf16_positions_with_emoji_cjk_and_crlf(tmp_path, repeater_model_dir):
    text = "s = '😀中文'\r\nt = s\r\n"
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir), "max_new_tokens": 4}) as client:
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


async def test_cancel_request_stops_generation_quickly(tmp_path, repeater_model_dir):
    # Multi-line: a single line would stop at 32 tokens, and these need a long generation.
    options = {"model": str(repeater_model_dir), "max_new_tokens": 1024, "speculative": False, "multiline": "always"}
    async with lsp_session(tmp_path, options) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 0, 0)  # warm up: the model is loaded
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(1, 4),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked))
        pending = asyncio.wrap_future(client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="to-cancel"))
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="to-cancel"))
        with pytest.raises(Exception, match="cancel"):
            await pending
        assert time.perf_counter() - started < 1.0
        # The server is free again soon: a short request comes back without waiting 1024 tokens.
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"memosight": {"max_new_tokens": 2}}))
        result = await inline(client, uri, 1, 4)
        assert result.items[0].insert_text == "xx"
        assert time.perf_counter() - started < 3.0
        counters = (await status(client))["requests"]
        assert counters["cancelled"] >= 1


async def test_newer_request_supersedes_the_older(tmp_path, repeater_model_dir):
    # Plain decoding keeps the older generation running long enough to be superseded.
    # Multi-line: a single line would stop at 32 tokens, and these need a long generation.
    options = {"model": str(repeater_model_dir), "max_new_tokens": 1024, "speculative": False, "multiline": "always"}
    async with lsp_session(tmp_path, options) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 0, 0)
        older = asyncio.ensure_future(inline(client, uri, 1, 4))
        await asyncio.sleep(0.2)
        newer = await inline(client, uri, 1, 4)
        assert not (await older).items  # superseded: no stale suggestion
        assert newer.items and len(newer.items[0].insert_text) == 1024
        assert (await status(client))["requests"]["superseded"] >= 1


async def test_invalid_config_value_is_reported_and_the_default_kept(tmp_path, repeater_model_dir):
    (tmp_path / ".memosight.toml").write_text(
        f'model = "{repeater_model_dir}"\nmax_new_tokens = "lots"\nmultline = "auto"\nmultiline = "always"\n')
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "a.py")
        result = await inline(client, uri, 1, 4)
        assert result.items and len(result.items[0].insert_text) == 64  # the default max_new_tokens
        messages = " | ".join(m.message for m in client.messages)
        assert "`max_new_tokens`" in messages and "whole number" in messages
        assert "`multline`" in messages and "unknown key" in messages


async def test_config_file_is_reloaded_when_it_changes(tmp_path, repeater_model_dir):
    config = tmp_path / "pyproject.toml"
    config.write_text(f'[tool.memosight]\nmodel = "{repeater_model_dir}"\nmax_new_tokens = 3\n')
    async with lsp_session(tmp_path) as client:
        uri = open_doc(client, tmp_path / "a.py")
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxx"
        config.write_text(f'[tool.memosight]\nmodel = "{repeater_model_dir}"\nmax_new_tokens = 5\n')
        os.utime(config, (time.time() + 5, time.time() + 5))
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "xxxxx"


async def test_editor_settings_override_the_config_file(tmp_path, repeater_model_dir):
    (tmp_path / ".memosight.toml").write_text(f'model = "{repeater_model_dir}"\nmax_new_tokens = 3\n')
    async with lsp_session(tmp_path, client_settings={"maxNewTokens": 7}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        for _ in range(100):  # initialized -> workspace/configuration round trip
            if (await status(client))["settings"]["max_new_tokens"] == 7:
                break
            await asyncio.sleep(0.1)
        assert (await inline(client, uri, 1, 4)).items[0].insert_text == "x" * 7


async def test_status_and_accepted_command(tmp_path, repeater_model_dir):
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir), "max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="memosight.accepted", arguments=[4]))
        info = await status(client)
        assert info["state"] == "ready"
        assert info["device"] == "cpu" and info["dtype"] == "float32"
        assert info["requests"]["accepted"] == 1 and info["requests"]["completed"] == 1
        assert info["requests"]["latency_ms"]["p50"] > 0
        assert "hit_rate" in info["cache"]


async def test_the_workspace_is_indexed_and_saved_files_reindexed(tmp_path, repeater_model_dir):
    (tmp_path / "util.py").write_text("def helper():\n    pass\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "skip.py").write_text("def vendored():\n    pass\n")
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir)}) as client:
        for _ in range(100):
            info = await status(client)
            if info["workspace"]["indexed"]:
                break
            await asyncio.sleep(0.05)
        assert info["workspace"] == {"root": str(tmp_path), "files": 1, "indexed": True}
        created = tmp_path / "new.py"
        created.write_text("def made_later():\n    pass\n")
        client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(created.as_uri())))
        for _ in range(100):
            if (await status(client))["workspace"]["files"] == 2:
                break
            await asyncio.sleep(0.05)
        assert (await status(client))["workspace"]["files"] == 2


async def test_clients_that_can_are_asked_to_watch_source_and_config_files(tmp_path, repeater_model_dir):
    config = ClientServerConfig(server_command=SERVER, server_env={**os.environ, "HF_HUB_OFFLINE": "1"})
    client = await config.start(devtools=None)
    registrations = []

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams):
        registrations.extend(params.registrations)

    capabilities = types.ClientCapabilities(workspace=types.WorkspaceClientCapabilities(
        did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)))
    await client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri=tmp_path.as_uri(), initialization_options={"model": str(repeater_model_dir)}))
    try:
        for _ in range(100):
            if registrations:
                break
            await asyncio.sleep(0.05)
        (registration,) = registrations
        assert registration.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES
        globs = [w["globPattern"] for w in registration.register_options["watchers"]]  # untyped JSON here
        assert "**/*.py" in globs and "**/*.ts" in globs and "**/.memosight.toml" in globs
        created = tmp_path / "made_outside.py"
        created.write_text("def from_a_checkout():\n    pass\n")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=created.as_uri(), type=types.FileChangeType.Created)]))
        for _ in range(100):
            if (await status(client))["workspace"]["files"] == 1:
                break
            await asyncio.sleep(0.05)
        assert (await status(client))["workspace"]["files"] == 1
    finally:
        await client.shutdown_session()


async def test_bad_requests_get_clear_answers_and_the_server_stays_up(tmp_path, repeater_model_dir):
    async with lsp_session(tmp_path, {"model": str(repeater_model_dir), "max_new_tokens": 3}) as client:
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
        huge = open_doc(client, tmp_path / "huge.py", "x = 1\n" * (20 * 1024 * 1024 // 6))
        assert not (await inline(client, huge, 3, 0)).items
        messages = " | ".join(m.message for m in client.messages)
        assert "binary" in messages and "8 MB limit" in messages
        assert (await status(client))["state"] == "ready"


async def test_missing_model_folder_is_reported_and_the_default_model_used(tmp_path):
    async with lsp_session(tmp_path, {"model": str(tmp_path / "missing-model")}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)
        assert any("missing-model" in m.message and "does not exist" in m.message and "default model" in m.message
                   for m in client.messages)
        info = await status(client)
        assert info["state"] == "ready" and info["model"] == "default"
