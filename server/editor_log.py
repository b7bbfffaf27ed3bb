"""What the editor's own log and progress show: the server's warnings as `window/logMessage` (its
output panel, beside the pop-ups that only some of them become), a work-done progress (`$/progress`)
while a model loads, and `$/logTrace` lines when the editor asked for a trace (`$/setTrace`, or
`trace` at initialize).

Warnings come from any thread (the engine's, the workspace scanner's): they go out on the event
loop, and at most LOG_LINES_PER_MINUTE a minute, so a failing loop cannot flood the editor."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from concurrent.futures import Future

from lsprotocol import types

LOG_LINES_PER_MINUTE = 60
LEVELS = {logging.ERROR: types.MessageType.Error, logging.WARNING: types.MessageType.Warning}


class EditorLog:
    def __init__(self, connection) -> None:
        self.connection = connection
        self.loop: asyncio.AbstractEventLoop | None = None  # the connection's, set at initialize
        self.trace = types.TraceValue.Off
        self.progress_supported = False  # the client's window.workDoneProgress
        self._sent: list[float] = []
        self._tokens = itertools.count(1)
        self._handler: _Forward | None = None

    def start(self, loop: asyncio.AbstractEventLoop, capabilities: types.ClientCapabilities,
              trace: types.TraceValue | None) -> None:
        """At initialize: the loop to send on, what the client takes, and the server's warnings
        forwarded (the logger "memosight", this server's lifetime)."""
        self.loop = loop
        self.progress_supported = bool(capabilities.window and capabilities.window.work_done_progress)
        self.trace = trace or types.TraceValue.Off
        if self._handler is None:
            self._handler = _Forward(self)
            logging.getLogger("memosight").addHandler(self._handler)

    def stop(self) -> None:
        if self._handler is not None:
            logging.getLogger("memosight").removeHandler(self._handler)
            self._handler = None

    def log(self, kind: types.MessageType, message: str) -> None:
        """A line in the editor's log for this server (any thread)."""
        now = time.monotonic()
        self._sent = [t for t in self._sent if now - t < 60]
        if len(self._sent) >= LOG_LINES_PER_MINUTE:
            return
        self._sent.append(now)
        self.on_loop(self.connection.notify, types.WINDOW_LOG_MESSAGE, types.LogMessageParams(kind, message))

    def tracing(self) -> bool:
        return self.trace != types.TraceValue.Off

    def trace_line(self, message: str, verbose: str | None = None) -> None:
        """`$/logTrace`, when the editor asked for a trace (`verbose` only with "verbose")."""
        if not self.tracing():
            return
        detail = verbose if self.trace == types.TraceValue.Verbose else None
        self.on_loop(self.connection.notify, types.LOG_TRACE, types.LogTraceParams(message, detail))

    async def progress(self, title: str, message: str, work: Future) -> None:
        """A progress bar in the editor from now until `work` ends (where the client shows them)."""
        if not self.progress_supported:
            return
        token = f"memosight-progress-{next(self._tokens)}"
        try:
            await self.connection.send_request(types.WINDOW_WORK_DONE_PROGRESS_CREATE,
                                               types.WorkDoneProgressCreateParams(token))
        except Exception as exc:  # a client that refuses: no progress bar, nothing else lost
            logging.getLogger(__name__).info("window/workDoneProgress/create failed: %s", exc)
            return
        self.connection.notify(types.PROGRESS, types.ProgressParams(
            token, types.WorkDoneProgressBegin(title=title, message=message)))
        try:
            await asyncio.wrap_future(work)
            done = "ready"
        except Exception as exc:
            done = f"failed: {exc}"[:300]
        self.connection.notify(types.PROGRESS, types.ProgressParams(token, types.WorkDoneProgressEnd(message=done)))

    def on_loop(self, send, *args) -> bool:
        """`send(*args)` on the connection's event loop, from any thread; False before initialize."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return False
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            send(*args)
        else:
            loop.call_soon_threadsafe(send, *args)
        return True


class _Forward(logging.Handler):
    """The server's warnings and errors to the editor's log. It holds its EditorLog weakly and
    leaves the logger once that is gone (a test's server, never shut down)."""

    def __init__(self, editor_log: EditorLog) -> None:
        super().__init__(logging.WARNING)
        self._target = weakref.ref(editor_log)
        self._sending = threading.local()  # a failed send logs an error: that one is not sent again

    def emit(self, record: logging.LogRecord) -> None:
        target = self._target()
        if target is None:
            logging.getLogger("memosight").removeHandler(self)
            return
        if getattr(self._sending, "on", False):
            return
        self._sending.on = True
        try:
            target.log(LEVELS.get(record.levelno, types.MessageType.Error), record.getMessage())
        except Exception:  # a log line must never fail the code that logged it
            self.handleError(record)
        finally:
            self._sending.on = False
