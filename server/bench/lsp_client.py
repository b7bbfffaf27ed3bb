"""A small LSP client over a subprocess's pipes: what the replay benchmark uses to talk to
`memosight-lsp --stdio` exactly as an editor does (Content-Length framed JSON-RPC)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from typing import Any


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The body of the next LSP frame the server wrote; None at the end of its output."""
    length = None
    while True:
        line = await reader.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode("ascii").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    if not length:
        raise ConnectionError("a message without Content-Length")
    return await reader.readexactly(length)


class LspProcess:
    def __init__(self, command: list[str], env: dict | None = None):
        self.command = command
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.notifications: list[tuple[str, Any]] = []
        self.answered_at: dict[int, float] = {}  # request id -> when its answer was read (perf_counter)
        self._reader: asyncio.Task | None = None
        self.closed = False

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=self.env)
        self._reader = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            await self._read_messages()
        finally:  # whatever ended the loop, nobody may wait forever for an answer
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("memosight-lsp closed the connection"))

    async def _read_messages(self) -> None:
        assert self.proc and self.proc.stdout
        while (body := await read_frame(self.proc.stdout)) is not None:
            message = json.loads(body)
            if "method" in message and "id" in message:  # a request from the server: answer null
                self._write({"jsonrpc": "2.0", "id": message["id"], "result": None})
            elif "method" in message:
                self.notifications.append((message["method"], message.get("params")))
            else:
                self.answered_at[message.get("id")] = time.perf_counter()
                if len(self.answered_at) > 10_000:  # nobody reads them: keep the memory bounded
                    self.answered_at.clear()
                fut = self._pending.pop(message.get("id"), None)
                if fut is not None and not fut.done():
                    if "error" in message:
                        fut.set_exception(RuntimeError(message["error"].get("message", "error")))
                    else:
                        fut.set_result(message.get("result"))

    def _write(self, payload: dict) -> None:
        assert self.proc and self.proc.stdin
        body = json.dumps(payload).encode()
        self.proc.stdin.write(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def request(self, method: str, params: Any) -> tuple[int, asyncio.Future]:
        msg_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_exception(ConnectionError("memosight-lsp closed the connection"))
            return msg_id, fut
        self._pending[msg_id] = fut
        self._write({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return msg_id, fut

    async def call(self, method: str, params: Any, timeout: float = 120.0) -> Any:
        _, fut = self.request(method, params)
        return await asyncio.wait_for(fut, timeout)

    def notify(self, method: str, params: Any) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def cancel(self, msg_id: int) -> None:
        self.notify("$/cancelRequest", {"id": msg_id})

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None and not self.closed:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await self.call("shutdown", None, timeout=10)
                self.notify("exit", None)
                await asyncio.wait_for(self.proc.wait(), 10)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it may have ended on its own meanwhile
                self.proc.kill()
            await self.proc.wait()
        if self._reader:
            self._reader.cancel()


def suggestion_text(result) -> str:
    """The first inline suggestion's text in a textDocument/inlineCompletion result (a list of
    items or an object with `items`; a snippet's value); "" for none."""
    items = (result or {}).get("items") if isinstance(result, dict) else result
    if not items:
        return ""
    text = items[0].get("insertText", "")
    return text if isinstance(text, str) else text.get("value", "")
