"""JSON-RPC over LSP's framing, with the guarantees pygls leaves to us.

pygls turns a request it cannot type into a log line and an error popup and never answers it; it
reads a body of any announced length into memory; it applies document edits to a store of its own
that splits lines where LSP does not. Here:
- every message is read within bounds: header lines of 8 KiB, bodies of MAX_MESSAGE_BYTES; a longer
  body is skipped without being held, and a lying Content-Length is recovered from at the next header;
- every request with a usable id gets exactly one answer: a result or an error with the JSON-RPC
  code that says what was wrong (-32700, -32600, -32601, -32602, -32002; -32800 for a cancel);
- a notification that cannot be used is logged and dropped: no popup per bad message;
- documents live in the server's own store (documents.py) only.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from cattrs import transform_error
from lsprotocol import types
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage
from pygls.protocol.language_server import lsp_method

from .timeline import Timeline

log = logging.getLogger(__name__)

MAX_HEADER_LINE = 8 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 50 MB file opened in full still fits
CONTENT_LENGTH = re.compile(rb"Content-Length:[ \t]*(\d{1,20})[ \t]*\r?\n", re.IGNORECASE)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_NOT_INITIALIZED = -32002
REQUEST_CANCELLED = -32800
# requests whose latency is broken down by stage (timeline.py)
TIMED_METHODS = {types.TEXT_DOCUMENT_INLINE_COMPLETION, types.TEXT_DOCUMENT_COMPLETION}


class Framer:
    """Reads LSP frames (headers, blank line, body) from `read(n)`, which returns at most n bytes
    and b"" at the end of the stream."""

    CHUNK = 64 * 1024

    def __init__(self, read: Callable[[int], Awaitable[bytes]], max_body: int = MAX_MESSAGE_BYTES):
        self._read = read
        self._buffer = bytearray()
        self._eof = False
        self.max_body = max_body
        self.skipped: list[int] = []  # announced lengths of bodies that were over the limit

    async def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = await self._read(self.CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    async def _line(self) -> bytes | None:
        """One header line, at most MAX_HEADER_LINE bytes (a longer one is dropped in pieces)."""
        while True:
            end = self._buffer.find(b"\n", 0, MAX_HEADER_LINE)
            if end >= 0:
                line = bytes(self._buffer[:end + 1])
                del self._buffer[:end + 1]
                return line
            if len(self._buffer) >= MAX_HEADER_LINE:
                log.warning("dropped %d bytes of a header line over %d bytes", MAX_HEADER_LINE, MAX_HEADER_LINE)
                del self._buffer[:MAX_HEADER_LINE]
                continue
            if not await self._fill():
                return None

    async def next_body(self) -> tuple[bytes | None, bytes]:
        """(body, its first bytes) of the next message; body None when it was over the limit and
        skipped (the first bytes may still say whose request it was). Raises EOFError at the end."""
        length = None
        while True:
            line = await self._line()
            if line is None:
                raise EOFError
            # search, not fullmatch: after a body whose length was announced short, its rest comes
            # before the next header on the same line; matching only whole lines would then lose
            # every later message, one header glued to the last body after another
            match = CONTENT_LENGTH.search(line)
            if match:
                if match.start():
                    log.warning("dropped %d bytes before a header (a wrong Content-Length?)", match.start())
                length = int(match.group(1))
            elif line.strip() == b"" and length is not None:
                break
            elif line.strip():  # Content-Type and others are allowed; anything else is noise
                if not line.lower().startswith(b"content-type:"):
                    log.warning("ignored a header line: %r", line[:80])
        if length <= self.max_body:
            while len(self._buffer) < length:
                if not await self._fill():
                    raise EOFError
            body = bytes(self._buffer[:length])
            del self._buffer[:length]
            return body, body[:4096]
        return None, await self._skip(length)

    async def _skip(self, length: int) -> bytes:
        """Drop a body over the limit without holding it. A JSON body never holds a raw
        "Content-Length: N" line (strings cannot hold raw line breaks), so finding one means the
        announced length was wrong: reading resumes there."""
        self.skipped.append(length)
        log.warning("a message of %d bytes is over the %d byte limit; skipped", length, self.max_body)
        head = bytearray()  # the first bytes dropped: they may say whose request it was
        left = length
        while left > 0:
            match = CONTENT_LENGTH.search(self._buffer)
            if match and match.start() < left:
                del self._buffer[:match.start()]
                log.warning("the skipped message ended early: a new header starts inside it")
                return b""  # its first bytes were the next message's: they name no request of its own
            available = min(len(self._buffer), left)
            drop = available if available == left else max(0, available - 40)  # keep half a header
            if drop:
                head += self._buffer[:max(0, min(drop, 4096 - len(head)))]
                del self._buffer[:drop]
                left -= drop
            elif not await self._fill():
                raise EOFError
        return bytes(head)


def top_level_id(head: bytes) -> int | str | None:
    """The id of a request from the first bytes of its body, if they hold it at the top level
    (used to answer a request whose body was too big to read)."""
    text = head.decode("utf-8", "replace").lstrip()
    if not text.startswith("{"):
        return None
    depth, i, in_string = 0, 0, False
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == '"':
            if depth == 1:
                match = re.match(r'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*[,}]', text[i:])
                if match:
                    value = json.loads(match.group(1))
                    return value if usable_id(value) else None
            in_string = True
        i += 1
    return None


def usable_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _params_error(exc: Exception) -> str:
    """What was wrong with a request's params, by field: "expected int @ $.params.position.line"."""
    try:
        details = transform_error(exc, path="$")
    except Exception:  # noqa: BLE001 - the plain message is still better than none
        details = [str(exc)]
    return "; ".join(details[:5])


def _is_request_type(message_type) -> bool:
    return attrs.has(message_type) and "id" in attrs.fields_dict(message_type)


class MemoSightProtocol(LanguageServerProtocol):
    """pygls's LSP protocol with the request checks above and without pygls's document store."""

    # Methods of this server's own that are notifications (lsprotocol knows none of them; any other
    # unknown method is taken for a request, which needs an id)
    custom_notifications: frozenset[str] = frozenset()

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.initialized = False  # a valid initialize request was handled
        self._finished: list = []  # ids of notification futures that are done, to drop (see _execute_handler)
        # called with a request's ended timeline and id once its answer is written (lsp.py registers it)
        self.on_answered: Callable[[Timeline, object], None] | None = None
        self._reading = 0.0  # when the message being dispatched was read
        self.received_at: dict = {}  # request id -> when it was read (for the completion handlers)
        self.timelines: dict = {}  # request id -> its Timeline, ended once its answer is written

    # --- reading --------------------------------------------------------------------------------

    def receive(self, body: bytes) -> None:
        """One message body: parsed, checked, handed to its handler or answered with an error."""
        self._reading = time.perf_counter()
        try:
            data = json.loads(body, parse_constant=_no_constants)
        except (ValueError, RecursionError) as exc:
            log.warning("a message that is not JSON: %s", exc)
            self.reply_error(None, PARSE_ERROR, f"Parse error: the message is not JSON ({exc})")
            return
        try:
            self.dispatch(data)
        except Exception as exc:  # noqa: BLE001 - the next message must still be read
            log.exception("handling a message failed")
            if isinstance(data, dict) and "method" in data and usable_id(data.get("id")):
                self.reply_error(data["id"], -32603, f"Internal error: {exc}")

    def refuse_oversized(self, head: bytes, length: int) -> None:
        msg_id = top_level_id(head)
        if msg_id is not None:
            self.reply_error(msg_id, INVALID_REQUEST, f"Invalid request: the message is {length} bytes, over "
                                                      f"the {MAX_MESSAGE_BYTES} byte limit; it was skipped")

    def dispatch(self, data: Any) -> None:
        if not isinstance(data, dict):
            what = "a batch (LSP has none)" if isinstance(data, list) else type(data).__name__
            self.reply_error(None, INVALID_REQUEST, f"Invalid request: a message must be a JSON object, got {what}")
            return
        method = data.get("method")
        msg_id = data.get("id")
        has_id = "id" in data
        if method is None and has_id and ("result" in data or "error" in data):
            self._receive_response(data)
            return
        if data.get("jsonrpc") != "2.0" or not isinstance(method, str):
            if has_id or method is None:
                self.reply_error(msg_id if usable_id(msg_id) else None, INVALID_REQUEST,
                                 'Invalid request: it needs "jsonrpc": "2.0" and a "method" string')
            else:
                log.warning("dropped a notification without jsonrpc 2.0")
            return
        if has_id:
            self._receive_request(msg_id, method, data)
        else:
            self._receive_notification(method, data)

    def _receive_request(self, msg_id: Any, method: str, data: dict) -> None:
        if not usable_id(msg_id):
            self.reply_error(None, INVALID_REQUEST, f"Invalid request: id must be a number or a string, got "
                                                    f"{json.dumps(msg_id)[:40]}")
            return
        if self._shutdown:
            self.reply_error(msg_id, INVALID_REQUEST, "Invalid request: the server is shutting down")
            return
        if method == types.INITIALIZE and self.initialized:
            self.reply_error(msg_id, INVALID_REQUEST, "Invalid request: the server is initialized already")
            return
        if method != types.INITIALIZE and not self.initialized:
            self.reply_error(msg_id, SERVER_NOT_INITIALIZED, "Server not initialized: send initialize first")
            return
        if not self._knows(method):
            self.reply_error(msg_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            return
        params = data.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            self.reply_error(msg_id, INVALID_PARAMS, "Invalid params: params must be an object or an array")
            return
        message_type = self.get_message_type(method)
        if message_type is not None and not _is_request_type(message_type):
            self.reply_error(msg_id, INVALID_REQUEST, f"Invalid request: {method} is a notification; send it "
                                                      "without an id")
            return
        if message_type is None:  # the server's own methods take any params
            message = JsonRPCRequestMessage(id=msg_id, method=method, jsonrpc="2.0", params=params)
        else:
            try:
                message = self._converter.structure(
                    {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}, message_type)
            except Exception as exc:  # noqa: BLE001 - cattrs reports a bad field in many ways
                self.reply_error(msg_id, INVALID_PARAMS, f"Invalid params for {method}: {_params_error(exc)}")
                return
        if method in TIMED_METHODS:
            if len(self.received_at) > 1000:  # stamps of requests whose handler never asked for them
                self.received_at.clear()
            self.received_at[msg_id] = self._reading
        self.handle_message(message)
        if method == types.INITIALIZE:
            self.initialized = True

    def _receive_notification(self, method: str, data: dict) -> None:
        if method != types.EXIT and (self._shutdown or not self.initialized):
            log.info("dropped %s: %s", method, "shutting down" if self._shutdown else "not initialized yet")
            return
        if not (self._knows(method) or method == types.CANCEL_REQUEST):
            log.debug("ignored the notification %s, which this server does not handle", method)
            return
        message_type = self.get_message_type(method)
        if message_type is None and method in self.custom_notifications:
            message_type = JsonRPCNotification  # its handler gets the params as they came
        if message_type is None or _is_request_type(message_type):  # nobody waits for what it would return
            log.warning("ignored %s sent as a notification: it is a request, and needs an id", method)
            return
        params = data.get("params")
        try:
            message = self._converter.structure({"jsonrpc": "2.0", "method": method, "params": params},
                                                message_type)
        except Exception as exc:  # noqa: BLE001 - any bad shape: the message is dropped, the server goes on
            self.report_dropped(method, _params_error(exc))
            return
        self.handle_message(message)

    def _receive_response(self, data: dict) -> None:
        msg_id = data.get("id")
        if not usable_id(msg_id) or msg_id not in self._request_futures:
            log.warning("a response to an unknown request %r", msg_id)
            return
        if "error" in data:
            try:
                message = self._converter.structure({"jsonrpc": "2.0", "id": msg_id, "error": data["error"]},
                                                    types.ResponseErrorMessage)
            except Exception:  # noqa: BLE001 - still an error for whoever waits on it
                message = types.ResponseErrorMessage(id=msg_id, error=types.ResponseError(-32603, "bad error"))
            self.handle_message(message)
            return
        result_type = self._result_types.pop(msg_id, None) or JsonRPCResponseMessage
        try:
            message = self._converter.structure({"jsonrpc": "2.0", "id": msg_id, "result": data["result"]},
                                                result_type)
        except Exception:  # noqa: BLE001 - keep the raw result rather than leave the caller waiting
            message = JsonRPCResponseMessage(id=msg_id, jsonrpc="2.0", result=data["result"])
        self.handle_message(message)

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        """pygls keeps the future of every handler it runs under its id until a response is sent;
        a notification (or a builtin's inner step) never sends one, so its future, holding the
        params (a whole text, for a full-sync didChange), stayed for the rest of the session. Those
        are dropped once done, here on the next message (pygls iterates the map at shutdown, and a
        cancelled future calls back at once); a request's future pygls drops when it answers."""
        while self._finished:
            self._request_futures.pop(self._finished.pop(), None)
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        answers = isinstance(callback, functools.partial) and callback.func == self._send_handler_result
        future = None if answers else self._request_futures.get(msg_id)
        if future is not None:
            future.add_done_callback(lambda _: self._finished.append(msg_id))

    # --- timing: where a completion request's milliseconds go (timeline.py) ----------------------

    def timeline_for(self, msg_id) -> Timeline:
        """A timeline for the request being handled, started when it was read; its answer, when
        written, ends it and hands it to the server's figures."""
        timeline = Timeline(self.received_at.pop(msg_id, None))
        timeline.mark("queue")
        self.timelines[msg_id] = timeline
        return timeline

    def _send_response(self, msg_id, result=None, error=None):
        timeline = self.timelines.pop(msg_id, None) if msg_id is not None else None
        if timeline is not None:
            timeline.mark("resume")  # the event loop, from the handler's end to here
        super()._send_response(msg_id, result, error)
        if timeline is not None:
            timeline.mark("reply")
            if error is not None:
                timeline.kind = "cancelled" if error.code == REQUEST_CANCELLED else "error"
            if self.on_answered is not None:
                self.on_answered(timeline, msg_id)

    def _knows(self, method: str) -> bool:
        return method in self.fm.builtin_features or method in self.fm.features

    def report_dropped(self, method: str, reason: str) -> None:
        log.warning("dropped a %s notification with bad params: %s", method, reason)
        self._server.report(f"MemoSight: a {method} message from the editor was malformed and ignored "
                            f"({reason[:200]}). If this repeats, reload the window.")

    def reply_error(self, msg_id: int | str | None, code: int, message: str) -> None:
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    # --- documents: the server's own store applies edits, with LSP's line rules ------------------

    def _own_handler(self, method: str, params):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield from self._own_handler(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield from self._own_handler(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield from self._own_handler(types.TEXT_DOCUMENT_DID_CLOSE, params)


async def serve(read: Callable[[int], Awaitable[bytes]], protocol: MemoSightProtocol,
                stop: threading.Event | None = None, max_body: int = MAX_MESSAGE_BYTES) -> None:
    """Read and handle messages until the stream ends (or `stop` is set)."""
    framer = Framer(read, max_body)
    while stop is None or not stop.is_set():
        try:
            body, head = await framer.next_body()
        except EOFError:
            return
        if body is None:
            protocol.refuse_oversized(head, framer.skipped[-1])
            continue
        protocol.receive(body)


def stdin_reader(stdin, executor) -> Callable[[int], Awaitable[bytes]]:
    """read(n) on a binary stream, off the event loop: at most n bytes, whatever has arrived."""
    read = getattr(stdin, "read1", stdin.read)

    def read_some(n: int) -> Awaitable[bytes]:
        return asyncio.get_running_loop().run_in_executor(executor, read, n)
    return read_some
