"""memosight-lsp as `memosight bench typing` types into it: the client logic of the Neovim client
this project ships (editors/nvim/lua/memosight/extmark.lua), spoken over the server's real pipes.

After every edit the client waits `debounce_ms` (the Neovim client's 50 ms) and asks for an inline
completion at the cursor; a newer request cancels the older one. An answer is drawn only when it
is for the buffer as it is now (the client compares the version it asked at). A suggestion the user
takes with Tab is inserted and reported with the `memosight.accepted` command, as the client does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from .lsp_client import LspProcess, suggestion_text
from .typing_system import SystemStats


def process_cpu_seconds(pid: int | None) -> float:
    """user + system CPU seconds of a live process (Linux /proc); 0 when unknown."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def position_of(text: str, offset: int) -> dict:
    line = text.count("\n", 0, offset)
    column = text[text.rfind("\n", 0, offset) + 1:offset]
    return {"line": line, "character": len(column.encode("utf-16-le")) // 2}


class LspSystem:
    """memosight-lsp in a subprocess. `options`: its initializationOptions (model, backend, ...);
    `model_pid`: the process whose CPU the model uses when it is not the server (a llama-server)."""

    def __init__(self, name: str, options: dict, *, root: str | None = None, debounce_ms: float = 50.0,
                 model_pid: int | None = None, ready_timeout: float = 600.0, log_file: str | None = None):
        self.name = name
        self.options = options
        self.root = root
        self.debounce = debounce_ms / 1000
        self.model_pid = model_pid
        self.ready_timeout = ready_timeout
        logging = ["--log-file", log_file, "--log-level", "debug"] if log_file else []
        self.lsp = LspProcess([sys.executable, "-m", "memosight.server", "--stdio", *logging],
                              env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")})
        self.stats = SystemStats()
        self.uri = ""
        self.text = ""
        self.version = 0
        self.shown: tuple[int, str] | None = None  # (buffer version it was asked at, text)
        self._asking: asyncio.Task | None = None
        self._pending: int | None = None  # id of the request in flight
        self._cpu_start = 0.0
        self.first_answer_s: float | None = None  # from start() to the first suggestion (cold)

    async def start(self) -> None:
        started = time.perf_counter()
        await self.lsp.start()
        await self.lsp.call("initialize", {"processId": os.getpid(), "rootUri": self.root, "capabilities": {},
                                           "initializationOptions": self.options})
        self.lsp.notify("initialized", {})
        # Wait for the engine as a user waits before the first suggestion: the first request's answer.
        uri = "file:///memosight-bench-typing-warmup.py"
        self.lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                  "text": "def add(a, b):\n    return a + b\n"}})
        await self.lsp.call("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}},
            timeout=self.ready_timeout)
        self.first_answer_s = time.perf_counter() - started
        self.lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        self._cpu_start = process_cpu_seconds(self._model_pid())

    def _model_pid(self) -> int | None:
        return self.model_pid or (self.lsp.proc.pid if self.lsp.proc else None)

    async def open(self, path: str, text: str, cursor: int) -> None:
        self.uri, self.text, self.version, self.shown = Path(path).resolve().as_uri(), text, 1, None
        self.lsp.notify("textDocument/didOpen", {"textDocument": {"uri": self.uri, "languageId": "python",
                                                                  "version": 1, "text": text}})
        # The shipped clients say where the cursor is on entering a buffer: the server warms there.
        self.lsp.notify("memosight/visited", {"textDocument": {"uri": self.uri},
                                              "line": position_of(text, cursor)["line"], "entered": True})

    async def edit(self, text: str, cursor: int, inserted: str, accepted: bool) -> None:
        at = position_of(self.text, cursor - len(inserted))
        self.version += 1
        self.text = text
        self.lsp.notify("textDocument/didChange", {
            "textDocument": {"uri": self.uri, "version": self.version},
            "contentChanges": [{"range": {"start": at, "end": at}, "text": inserted}]})
        if accepted:
            self.lsp.request("workspace/executeCommand", {"command": "memosight.accepted",
                                                          "arguments": [len(inserted)]})
        if self._asking is not None:
            self._asking.cancel()
        self._asking = asyncio.create_task(self._ask(self.version, cursor, time.perf_counter()))

    async def _ask(self, version: int, cursor: int, edited_at: float) -> None:
        await asyncio.sleep(self.debounce)
        if self._pending is not None:  # a newer request cancels the older one
            self.lsp.cancel(self._pending)
        msg_id, answer = self.lsp.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": self.uri}, "position": position_of(self.text, cursor),
            "context": {"triggerKind": 2}})
        self._pending = msg_id
        self.stats.requests += 1
        # an answer nobody awaits any more (a newer edit came) is still read, errors included
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            result = await asyncio.shield(answer)
        except (RuntimeError, ConnectionError):  # cancelled on the server's side, or it went away
            return
        finally:
            if self._pending == msg_id and answer.done():  # a cancelled task leaves it for the next to cancel
                self._pending = None
        text = suggestion_text(result)
        if text and version == self.version:
            self.shown = (version, text)
            self.stats.latencies_ms.append((self.lsp.answered_at.get(msg_id, time.perf_counter()) - edited_at) * 1000)

    def visible(self) -> str:
        return self.shown[1] if self.shown is not None and self.shown[0] == self.version else ""

    async def close(self, path: str) -> None:
        if self._asking is not None:
            self._asking.cancel()
        self.lsp.notify("textDocument/didClose", {"textDocument": {"uri": self.uri}})
        self.shown = None

    async def stop(self) -> SystemStats:
        self.stats.model_cpu_s = process_cpu_seconds(self._model_pid()) - self._cpu_start
        try:
            status = await self.lsp.call("memosight/status", {}, timeout=30)
        except Exception:  # noqa: BLE001 - the figures above stand without it
            status = {}
        requests = status.get("requests", {})
        self.stats.notes = {k: requests.get(k) for k in ("typed_through", "joined", "superseded", "cancelled")
                            if k in requests}
        if status.get("completion_cache"):
            self.stats.notes["completion_cache"] = status["completion_cache"]
        self.stats.notes["first_answer_s"] = round(self.first_answer_s or 0.0, 2)
        self.stats.notes["server_peak_rss_mb"] = status.get("peak_rss_mb")
        await self.lsp.stop()
        return self.stats
