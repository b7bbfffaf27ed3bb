"""What the editor's log and progress show: the server's warnings as window/logMessage, a progress
bar while the model loads, $/logTrace once the editor asks for a trace."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

from lsprotocol import types
from pytest_lsp.client import make_test_lsp_client


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_progress_bar_runs_while_the_model_loads(lsp_session, scripted_engine, tmp_path):
    engine, gate = scripted_engine(), threading.Event()

    def slow_load(settings):
        assert gate.wait(10), "the test never let the load end"
        return engine

    capabilities = types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True))
    async with lsp_session(tmp_path, engine, capabilities=capabilities, load_engine=slow_load) as client:
        await until(lambda: any(client.progress_reports.values()))
        (_token, reports), = client.progress_reports.items()
        assert isinstance(reports[0], types.WorkDoneProgressBegin) and "loading" in reports[0].message
        assert len(reports) == 1  # not ended while the load runs
        gate.set()
        await until(lambda: len(reports) == 2)
        assert isinstance(reports[1], types.WorkDoneProgressEnd) and reports[1].message == "ready"


async def test_no_progress_bar_for_a_client_without_them(lsp_session, scripted_engine, tmp_path):
    engine, gate = scripted_engine(), threading.Event()
    gate.set()
    async with lsp_session(tmp_path, engine, load_engine=lambda s: gate.wait(5) and engine) as client:
        await asyncio.sleep(0.1)
        assert client.progress_reports == {}


async def test_the_servers_warnings_reach_the_editors_log(lsp_session, tmp_path):
    async with lsp_session(tmp_path, init_options={"context_budget": "lots"}) as client:
        await until(lambda: any("context_budget" in m.message for m in client.log_messages))
        logged = next(m for m in client.log_messages if "context_budget" in m.message)
        assert logged.type == types.MessageType.Warning
        logging.getLogger("memosight.server.test").error("something broke in a thread")
        try:
            await until(lambda: any(m.message == "something broke in a thread" for m in client.log_messages))
        except AssertionError:
            lg = logging.getLogger("memosight.server.test")
            root = logging.getLogger("memosight")
            print("LOGGED", len(client.log_messages), lg.disabled, lg.getEffectiveLevel(), root.disabled, root.level,
                  root.handlers, logging.root.manager.disable)
            raise
        assert client.log_messages[-1].type == types.MessageType.Error


async def test_a_trace_once_the_editor_asks_for_one(lsp_session, tmp_path):
    client = make_test_lsp_client()
    traces: list[types.LogTraceParams] = []

    @client.feature(types.LOG_TRACE)
    def log_trace(params: types.LogTraceParams) -> None:
        traces.append(params)

    async with lsp_session(tmp_path, client=client) as client:
        uri = (tmp_path / "m.py").as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri, "python", 1, "def add(a, b):\n    return ")))
        ask = types.InlineCompletionParams(
            types.InlineCompletionContext(types.InlineCompletionTriggerKind.Invoked),
            types.TextDocumentIdentifier(uri), types.Position(1, 11))
        await client.text_document_inline_completion_async(ask)
        assert traces == []  # off until asked
        client.protocol.notify(types.SET_TRACE, types.SetTraceParams(types.TraceValue.Verbose))
        await client.text_document_inline_completion_async(ask)
        await until(lambda: traces)
        assert traces[0].message.startswith(f"completion at {uri}:2:12: ") and traces[0].verbose


async def test_a_gone_servers_forwarder_never_hides_the_live_servers_line():
    from memosight.server.editor_log import EditorLog

    sent = []

    class Connection:
        def notify(self, method, params):
            sent.append(params.message)

    loop = asyncio.get_running_loop()
    gone, live = EditorLog(Connection()), EditorLog(Connection())
    gone.start(loop, types.ClientCapabilities(), None)
    live.start(loop, types.ClientCapabilities(), None)
    del gone  # a test's server, never shut down: its forwarder stays on the logger, before the live one's
    gc.collect()
    logging.getLogger("memosight.server.test").warning("seen")
    live.stop()
    assert sent == ["seen"]  # once: the gone one sends nothing, and the live one is not skipped


async def test_a_long_line_is_cut_before_it_reaches_the_editor():
    from memosight.server.editor_log import LOG_LINE_CHARS, EditorLog

    sent = []

    class Connection:
        def notify(self, method, params):
            sent.append(params.message)

    log = EditorLog(Connection())
    log.start(asyncio.get_running_loop(), types.ClientCapabilities(), None)
    log.log(types.MessageType.Warning, "x" * 5_000_000)  # an error quoting a client's 5 MB document
    log.stop()
    (line,) = sent
    assert len(line) < LOG_LINE_CHARS + 50 and line.endswith("(4,998,000 characters more)")
