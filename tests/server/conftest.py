"""The server's tests run against the engine protocol: a scripted test engine, and the real
language server in this process, spoken to over in-memory pipes by pytest-lsp's client."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from lsprotocol import types
from memosight.engine.protocol import (
    Completion,
    CompletionRequest,
    EngineInfo,
    EngineSettings,
    Stream,
)
from memosight.engine.text.stops import StreamState, stream_text
from pygls.io_ import run_async
from pytest_lsp import make_test_lsp_client


class ScriptedEngine:
    """A test engine behind the engine protocol: it writes `text` one character per token (repeated
    forever when `repeat`, like a model stuck on one token), applying the request's stop rules the
    way every engine does, `delay` seconds a token, stopping when the request is cancelled. A list
    of texts: one per request in turn, the last for every request after."""

    def __init__(self, text: str | list[str] = "x", delay: float = 0.0, repeat: bool = True):
        self.texts = [text] if isinstance(text, str) else list(text)
        self.text, self.delay, self.repeat = self.texts[0], delay, repeat
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
        self.text = self.texts[min(len(self.requests), len(self.texts)) - 1]
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
                          latency, state.stop_reason, stages_ms={"decode": latency})

    def prefill(self, request: CompletionRequest) -> None:
        self.prefills.append(request)

    def refresh(self, cancel) -> None:
        return None  # nothing reused approximately

    def info(self) -> EngineInfo:
        return EngineInfo("scripted", "cpu", "float32", has_fim=True)

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
                             capabilities: types.ClientCapabilities | None = None, load_engine=None,
                             client=None):
    """The real MemoSight language server, in this process and event loop, with `engine` (a
    ScriptedEngine by default; `load_engine(settings)`: how the server gets it); yields pytest-lsp's
    client (`client`: one with handlers of a test's own), initialized, with `.server` and `.engine`."""
    from memosight.server.lsp import create_server
    from memosight.server.rpc.connection import serve
    from memosight.server.rpc.framing import FrameWriter

    engine = engine if engine is not None else ScriptedEngine()
    server = create_server(load_engine=load_engine or (lambda settings: engine))
    to_server, to_client = _Pipe(), _Pipe()
    client = client or make_test_lsp_client()
    server.connection.set_writer(FrameWriter(to_client))
    client.protocol.set_writer(to_server)
    server_stop, client_stop = threading.Event(), threading.Event()
    log = logging.getLogger("in-process-lsp")
    tasks = [asyncio.ensure_future(serve(to_server.reader.read, server.connection, server_stop)),
             asyncio.ensure_future(run_async(client_stop, to_client.reader, client.protocol, log))]
    if client_settings is not None:
        client.set_configuration({"memosight": client_settings})
    if capabilities is None:
        capabilities = types.ClientCapabilities(
            workspace=types.WorkspaceClientCapabilities(configuration=client_settings is not None))
    client.initialize_result = await client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri=root.as_uri(),
        # the tests read the engine's requests as the user's: a prefetch is on only where a test asks;
        # no time budget, which a slow machine would spend before a scripted text is out
        initialization_options={"prefetch": False, "latency_budget_ms": 0, **(init_options or {})}))
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


class RawClient:
    """Bytes in, frames out: an LSP client that sends anything (a hostile or broken one), talking to
    the real server in this process. `answers` counts the responses per id."""

    def __init__(self, server, max_body: int | None = None) -> None:
        from memosight.server.rpc.connection import serve
        from memosight.server.rpc.framing import MAX_MESSAGE_BYTES, Framer, FrameWriter

        self.server = server
        self.to_server, self.from_server = asyncio.StreamReader(), asyncio.StreamReader()
        server.connection.set_writer(FrameWriter(self))
        self.task = asyncio.ensure_future(serve(self.to_server.read, server.connection,
                                                max_body=max_body or MAX_MESSAGE_BYTES))
        self.framer = Framer(self.from_server.read)
        self.received: list[dict] = []
        self.answers: dict = {}

    def write(self, data: bytes) -> None:  # the server's writer
        self.from_server.feed_data(data)

    def send_raw(self, data: bytes) -> None:
        self.to_server.feed_data(data)

    def send(self, message, raw_body: bytes | None = None) -> None:
        body = raw_body if raw_body is not None else json.dumps(message).encode()
        self.send_raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def next(self, timeout: float = 10.0) -> dict:
        body, _ = await asyncio.wait_for(self.framer.next_body(), timeout)
        message = json.loads(body)  # the server's output must be strict JSON (no NaN)
        self.received.append(message)
        if "id" in message and "method" not in message:
            key = json.dumps(message["id"])
            self.answers[key] = self.answers.get(key, 0) + 1
        return message

    async def answer(self, msg_id, timeout: float = 10.0) -> dict:
        """The response to `msg_id` (messages before it are kept in `received`)."""
        for message in self.received:  # it may have come while another answer was awaited
            if "method" not in message and message.get("id") == msg_id:
                return message
        while True:
            message = await self.next(timeout)
            if "method" not in message and message.get("id") == msg_id:
                return message

    async def request(self, msg_id, method: str, params=None, **extra) -> dict:
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method, **extra}
        if params is not None:
            message["params"] = params
        self.send(message)
        return await self.answer(msg_id)

    def notify(self, method: str, params=None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})})

    def popups(self) -> list[dict]:
        return [m for m in self.received if m.get("method") == "window/showMessage"]

    async def initialize(self, root: Path) -> dict:
        # no time budget: a slow machine would cut the scripted texts the tests read back
        answer = await self.request("init", "initialize", {"processId": None, "rootUri": root.as_uri(),
                                                            "capabilities": {},
                                                            "initializationOptions": {"latency_budget_ms": 0}})
        self.notify("initialized", {})
        return answer

    async def close(self) -> None:
        self.to_server.feed_eof()
        await asyncio.wait_for(self.task, 10)
        if self.server.workspace_index is not None:
            self.server.workspace_index.ready.wait(5)


@pytest.fixture
def raw_client():
    """A function: `client = raw_client(engine=None, max_body=None)`, a RawClient on a new server."""
    from memosight.server.lsp import create_server

    clients = []

    def make(engine=None, max_body: int | None = None) -> RawClient:
        engine = engine if engine is not None else ScriptedEngine()
        client = RawClient(create_server(load_engine=lambda settings: engine), max_body)
        client.engine = engine
        clients.append(client)
        return client
    yield make
    for client in clients:
        client.task.cancel()


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


async def _status(client, params: dict | None = None) -> dict:
    return _plain(await client.protocol.send_request_async("memosight/status", params or {}))


@pytest.fixture
def lsp_status():
    """A function: `await lsp_status(client[, params])` is the server's memosight/status answer, as a dict."""
    return _status
