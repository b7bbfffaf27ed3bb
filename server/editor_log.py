"""What the editor's own log and progress show: the server's warnings as `window/logMessage` (its
output panel, beside the pop-ups that only some of them become), a work-done progress (`$/progress`)
while a model loads or downloads, and `$/logTrace` lines when the editor asked for a trace
(`$/setTrace`, or `trace` at initialize).

Warnings come from any thread (the engine's, the workspace scanner's): they go out on the event
loop, at most LOG_LINES_PER_MINUTE a minute and LOG_LINE_CHARS a line, so a failing loop cannot
flood the editor."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future

from lsprotocol import types

LOG_LINES_PER_MINUTE = 60
LOG_LINE_CHARS = 2000  # a line longer than this is cut: an error may quote what a client sent (megabytes)
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
            logger = logging.getLogger("memosight")
            for gone in [h for h in logger.handlers if isinstance(h, _Forward) and h.gone()]:
                logger.removeHandler(gone)  # a test's server, never shut down
            self._handler = _Forward(self)
            logger.addHandler(self._handler)

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
        if len(message) > LOG_LINE_CHARS:
            message = f"{message[:LOG_LINE_CHARS]}... ({len(message) - LOG_LINE_CHARS:,} characters more)"
        self.on_loop(self.connection.notify, types.WINDOW_LOG_MESSAGE, types.LogMessageParams(kind, message))

    def tracing(self) -> bool:
        return self.trace != types.TraceValue.Off

    def trace_line(self, message: str, verbose: str | None = None) -> None:
        """`$/logTrace`, when the editor asked for a trace (`verbose` only with "verbose")."""
        if not self.tracing():
            return
        detail = verbose if self.trace == types.TraceValue.Verbose else None
        self.on_loop(self.connection.notify, types.LOG_TRACE, types.LogTraceParams(message, detail))

    async def progress(self, title: str, message: str, work: Future, reports: ProgressReports | None = None,
                       done: str = "ready") -> None:
        """A progress bar in the editor from now until `work` ends (where the client shows them);
        with `reports`, one that fills as they say (a percentage). It ends saying `done`, or why
        the work failed."""
        if not self.progress_supported:
            return
        token = f"memosight-progress-{next(self._tokens)}"
        try:
            await self.connection.send_request(types.WINDOW_WORK_DONE_PROGRESS_CREATE,
                                               types.WorkDoneProgressCreateParams(token))
        except Exception as exc:  # noqa: BLE001 - a client that refuses: no progress bar, nothing else lost
            logging.getLogger(__name__).info("window/workDoneProgress/create failed: %s", exc)
            return
        self.connection.notify(types.PROGRESS, types.ProgressParams(
            token, types.WorkDoneProgressBegin(title=title, message=message, percentage=0 if reports else None)))
        if reports is not None:
            reports.attach(lambda report: self.connection.notify(types.PROGRESS, types.ProgressParams(token, report)))
        try:
            await asyncio.wrap_future(work)
        except Exception as exc:  # noqa: BLE001 - any failure ends the bar, saying why
            done = f"failed: {exc}"[:300]
        finally:
            if reports is not None:
                reports.attach(None)
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


class ProgressReports:
    """A progress bar's percentages, told from any thread (a download's): each whole percent goes
    to the editor once, on the event loop, while EditorLog.progress shows the bar (the latest one
    told before the bar was shown goes when it is)."""

    def __init__(self, editor_log: EditorLog) -> None:
        self._editor_log = editor_log
        self._told: int | None = None  # the last percentage told (the telling thread's)
        self._latest: types.WorkDoneProgressReport | None = None  # the loop's, as the rest below
        self._send: Callable[[types.WorkDoneProgressReport], None] | None = None

    def report(self, percentage: float, message: str | None = None) -> None:
        percentage = max(0, min(100, int(percentage)))
        if percentage == self._told:
            return
        self._told = percentage
        self._editor_log.on_loop(self._arrived, types.WorkDoneProgressReport(message=message, percentage=percentage))

    def attach(self, send: Callable[[types.WorkDoneProgressReport], None] | None) -> None:
        """On the loop: where reports go now (None: nowhere, the bar has ended)."""
        self._send = send
        if send is not None and self._latest is not None:
            send(self._latest)

    def _arrived(self, report: types.WorkDoneProgressReport) -> None:
        self._latest = report
        if self._send is not None:
            self._send(report)


class _Forward(logging.Handler):
    """The server's warnings and errors to the editor's log. It holds its EditorLog weakly: once
    that is gone (a test's server, never shut down) it sends nothing, and the next server's start
    takes it off the logger. Never here: a handler that leaves the list logging is walking makes it
    skip the next one (the live server's)."""

    def __init__(self, editor_log: EditorLog) -> None:
        super().__init__(logging.WARNING)
        self._target = weakref.ref(editor_log)
        self._sending = threading.local()  # a failed send logs an error: that one is not sent again

    def gone(self) -> bool:
        return self._target() is None

    def emit(self, record: logging.LogRecord) -> None:
        target = self._target()
        if target is None:
            return
        if getattr(self._sending, "on", False):
            return
        self._sending.on = True
        try:
            target.log(LEVELS.get(record.levelno, types.MessageType.Error), record.getMessage())
        except Exception:  # noqa: BLE001 - a log line must never fail the code that logged it
            self.handleError(record)
        finally:
            self._sending.on = False
