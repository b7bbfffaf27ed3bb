"""The server's tests run against the engine protocol: a scripted test engine, and the real
language server in this process, spoken to over in-memory pipes by pytest-lsp's client."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.io_ import run_async
from pytest_lsp import make_test_lsp_client

from memosight.engine.protocol import Completion, CompletionRequest, EngineSettings, Stream
from memosight.engine.stops import StreamState, stream_text


class ScriptedEngine:
    """A test engine behind the engine protocol: it writes `text` one character per token (repeated
    forever when `repeat`, like a model stuck on one token), applying the request's stop rules the
    way every engine does, `delay` seconds a token, stopping when the request is cancelled."""

    def __init__(self, text: str = "x", delay: float = 0.0, repeat: bool = True):
        self.text, self.delay, self.repeat = text, delay, repeat
        self.requests: list[CompletionRequest] = []
        self.prefills: list[CompletionRequest] = []
        self.settings: list[EngineSettings] = []
        self.running = threading.Event()  # set while a generation runs
        self.emitted = 0  # tokens written by the current generation
        self.closed = False

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def stream(self, request: CompletionRequest) -> Stream:
        self.requests.append(request)
        return Stream(self._generate(request))

    def _generate(self, request: CompletionRequest):
        started = time.perf_counter()
        state = StreamState(started=started)
        end = len(self.text) if not self.repeat else None
        eos = -1

        def tokens():
            for i in range(request.max_new_tokens):
                if request.cancel.is_set():
                    return
                if self.delay:
                    time.sleep(self.delay)
                self.emitted = i + 1
                yield eos if end is not None and i >= end else i

        def decode(ids: list[int]) -> str:
            return "".join(self.text[i % len(self.text)] for i in ids)

        self.emitted = 0
        self.running.set()
        try:
            yield from stream_text(tokens(), decode, request.stop, {eos}, state)
        finally:
            self.running.clear()
        if request.cancel.is_set():
            state.stop_reason = "cancelled"
        latency = (time.perf_counter() - started) * 1000
        return Completion(state.text, state.tokens, self.count_tokens(request.prefix + request.suffix), latency,
                          latency, state.stop_reason)

    def prefill(self, request: CompletionRequest) -> None:
        self.prefills.append(request)

    def status(self) -> dict:
        return {"model": "scripted", "device": "cpu", "dtype": "float32", "cache": {"hit_rate": 0.0}}

    def configure(self, settings: EngineSettings) -> None:
        self.settings.append(settings)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def scripted_engine():
    """The ScriptedEngine class, to build test engines with."""
    return ScriptedEngine


class _Pipe:
    """One direction of an in-memory connection: what is written is read on the other side."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()

    def write(self, data: bytes) -> None:
        self.reader.feed_data(data)

    def close(self) -> None:
        self.reader.feed_eof()


@asynccontextmanager
async def in_process_session(root: Path, engine=None, init_options: dict | None = None,
                             client_settings: dict | None = None,
                             capabilities: types.ClientCapabilities | None = None):
    """The real MemoSight language server, in this process and event loop, with `engine` (a
    ScriptedEngine by default); yields pytest-lsp's client, initialized, with `.server` and `.engine`."""
    from memosight.server.lsp import create_server

    engine = engine if engine is not None else ScriptedEngine()
    server = create_server(load_engine=lambda settings: engine)
    to_server, to_client = _Pipe(), _Pipe()
    client = make_test_lsp_client()
    server.protocol.set_writer(to_client)
    client.protocol.set_writer(to_server)
    server_stop, client_stop = threading.Event(), threading.Event()
    log = logging.getLogger("in-process-lsp")
    tasks = [asyncio.ensure_future(run_async(server_stop, to_server.reader, server.protocol, log)),
             asyncio.ensure_future(run_async(client_stop, to_client.reader, client.protocol, log))]
    if client_settings is not None:
        client.set_configuration({"memosight": client_settings})
    if capabilities is None:
        capabilities = types.ClientCapabilities(
            workspace=types.WorkspaceClientCapabilities(configuration=client_settings is not None))
    client.initialize_result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri=root.as_uri(), initialization_options=init_options))
    client.server, client.engine = server, engine
    try:
        yield client
    finally:
        await client.shutdown_async(None)  # no `exit`: the server would end this process
        server_stop.set()
        client_stop.set()
        to_server.close()
        to_client.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server.workspace_index is not None:
            server.workspace_index.ready.wait(5)  # let a background scan end before its folder is deleted


@pytest.fixture
def lsp_session():
    """A function: `async with lsp_session(root, engine, init_options, ...) as client`."""
    return in_process_session


def _plain(obj):
    """pygls hands back untyped JSON objects as namedtuples: make them dicts and lists again."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    items = obj.items() if isinstance(obj, dict) else vars(obj).items()
    return {k: _plain(v) for k, v in items}


async def _status(client) -> dict:
    return _plain(await client.protocol.send_request_async("memosight/status", {}))


@pytest.fixture
def lsp_status():
    """A function: `await lsp_status(client)` is the server's memosight/status answer, as a dict."""
    return _status
