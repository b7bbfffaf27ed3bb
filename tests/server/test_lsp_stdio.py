"""End to end over stdio with a real model: pytest-lsp starts `memosight-lsp --stdio` and talks to
it as an editor does. The handlers' other behaviour is tested in-process (test_lsp.py)."""

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
STREAMING = types.ClientCapabilities(experimental={"memosight": {"partialCompletion": True}})


@asynccontextmanager
async def stdio_session(root: Path, init_options: dict | None = None):
    config = ClientServerConfig(server_command=SERVER, server_env={**os.environ, "HF_HUB_OFFLINE": "1"})
    client = await config.start(devtools=None)
    await client.initialize_session(types.InitializeParams(
        capabilities=STREAMING, root_uri=root.as_uri(), initialization_options=init_options))
    try:
        yield client
    finally:
        await client.shutdown_session()


def open_doc(client, path: Path, text: str = SOURCE) -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    return uri


def inline_params(uri: str, line: int, character: int) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(line, character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))


async def test_a_real_model_completes_after_edits_counts_acceptance_and_reports_its_cache(tmp_path, repeater_model_dir,
                                                                                        lsp_status):
    # The repeater model writes "x" forever: token healing would make it rewrite the word first.
    options = {"model": str(repeater_model_dir), "max_new_tokens": 8, "token_healing": False,
               "latency_budget_ms": 0}  # all 8 tokens, however slow the machine
    async with stdio_session(tmp_path, options) as client:
        uri = open_doc(client, tmp_path / "a.py")
        # Type " ret" at the start of a new line inside main(), as an editor would.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(5, 20), types.Position(5, 20)), text="\n    ret")]))
        (item,) = (await client.text_document_inline_completion_async(inline_params(uri, 6, 7))).items
        assert item.insert_text == "x" * 8 and item.range is None
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="memosight.accepted", arguments=[8]))
        await client.text_document_inline_completion_async(inline_params(uri, 6, 6))  # one character back
        info = await lsp_status(client)
        assert info["state"] == "ready" and info["device"] == "cpu"
        assert info["dtype"] == info["dtype_choice"]["dtype"]  # "auto", measured on this CPU
        assert info["cpu"]["onednn_isa"] and info["cpu"]["threads"] >= 1
        assert info["requests"]["accepted"] == 1 and info["requests"]["completed"] == 2
        assert info["requests"]["latency_ms"]["p50"] > 0
        assert info["cache"]["reused_tokens"] > 0  # the second prompt reused the first one's KV cache


async def test_cancel_request_stops_generation_quickly(tmp_path, repeater_model_dir, lsp_status):
    # Multi-line: a single line would stop at 32 tokens, and this needs a long generation.
    options = {"model": str(repeater_model_dir), "max_new_tokens": 1024, "speculative": False, "multiline": "always",
               "token_healing": False}
    async with stdio_session(tmp_path, options) as client:
        uri = open_doc(client, tmp_path / "a.py")
        pending = asyncio.wrap_future(client.protocol.send_request(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 1, 4), msg_id="to-cancel"))
        await client.wait_for_notification("memosight/partialCompletion")  # it is generating
        started = time.perf_counter()
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="to-cancel"))
        with pytest.raises(Exception, match="cancel"):
            await pending
        assert time.perf_counter() - started < 1.0
        # The server is free again soon: a short request comes back without waiting 1024 tokens.
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"memosight": {"max_new_tokens": 2}}))
        result = await client.text_document_inline_completion_async(inline_params(uri, 1, 4))
        assert result.items[0].insert_text == "xx"
        assert time.perf_counter() - started < 10.0  # not the 1024 tokens (minutes) of the cancelled one
        counters = (await lsp_status(client))["requests"]
        assert counters["cancelled"] >= 1


async def test_missing_model_folder_is_reported_and_the_default_model_used(tmp_path, lsp_status):
    async with stdio_session(tmp_path, {"model": str(tmp_path / "missing-model")}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await client.text_document_inline_completion_async(inline_params(uri, 1, 4))
        assert any("missing-model" in m.message and "does not exist" in m.message and "default model" in m.message
                   for m in client.messages)
        info = await lsp_status(client)
        assert info["state"] == "ready" and info["model"] == "default"
