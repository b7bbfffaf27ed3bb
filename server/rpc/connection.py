"""JSON-RPC 2.0 for the language server: a method table, params typed by lsprotocol, one answer
for every request.

Our own, over lsprotocol's converter (docs/ARCHITECTURE.md, "pygls"), because what the server needs
beyond the spec is exactly what a framework leaves out:
- every request with a usable id gets exactly one answer: a result, or an error with the JSON-RPC
  code that says what was wrong (-32700, -32600, -32601, -32602, -32002; -32800 when cancelled);
- a notification that cannot be used is logged and dropped (no popup per bad message);
- a handler's task is dropped once it has answered, so nothing is kept per message.
Framing (bounds on what is read, whole frames written) is framing.py's.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from cattrs import transform_error
from lsprotocol import converters, types

from .framing import MAX_MESSAGE_BYTES, Framer, top_level_id, usable_id

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002
REQUEST_CANCELLED = -32800
CONTENT_MODIFIED = -32801  # LSP: the document changed under a request in flight

Handler = Callable[[Any], Any]  # takes the params (typed where lsprotocol or its registration knows the method); may be async

_request_id: contextvars.ContextVar = contextvars.ContextVar("request_id", default=None)


def current_request_id():
    """The id of the request whose handler is running (in its task, across awaits)."""
    return _request_id.get()


class RequestError(Exception):
    """Raised by a handler: the request is answered with this JSON-RPC error."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _encode(message: dict) -> bytes:
    # strict JSON: a NaN would be written as a bare NaN, which editors' JSON parsers reject
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _what_was_wrong(exc: BaseException, expected: type | None) -> str:
    """cattrs' words for a bad value, and a validator's own ("'line' must be >= 0: -1")."""
    from cattrs.v import format_exception

    if type(exc) is ValueError and expected is None and str(exc):
        return f"invalid value ({exc})"
    return format_exception(exc, expected)


def _params_error(exc: Exception) -> str:
    """What was wrong with a message's params, by field: "expected int @ $.params.position.line"."""
    try:
        details = transform_error(exc, path="$.params", format_exception=_what_was_wrong)
    except Exception:  # noqa: BLE001 - the plain message is still better than none
        details = [str(exc)]
    return "; ".join(details[:5])


def _lsp_types(method: str) -> tuple[type | None, type | None, type | None]:
    """(message type, response type, params type) of an LSP method; Nones for one of our own."""
    known = types.METHOD_TO_TYPES.get(method)
    return (known[0], known[1], known[2]) if known else (None, None, None)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def register_params_type(converter, cls: type) -> None:
    """An attrs class of our own for a method's params, read like lsprotocol's: camelCase on the wire
    (text_document <- textDocument), and unknown keys ignored (a newer client may send more)."""
    from cattrs.gen import make_dict_structure_fn, override

    renames = {f.name: override(rename=_camel(f.name)) for f in attrs.fields(cls) if "_" in f.name}
    converter.register_structure_hook(cls, make_dict_structure_fn(cls, converter, **renames))


def _is_request_type(message_type) -> bool:
    return attrs.has(message_type) and "id" in attrs.fields_dict(message_type)


class Connection:
    """One client's JSON-RPC session: its handlers, the requests in flight both ways, the writer."""

    def __init__(self, on_answered: Callable[[Any, int | None, float], None] | None = None,
                 on_error: Callable[[Exception, str], None] | None = None,
                 on_dropped: Callable[[str, str], None] | None = None) -> None:
        self.converter = converters.get_converter()
        self.requests: dict[str, Handler] = {}
        self.notifications: dict[str, Handler] = {}
        self.params_types: dict[str, type] = {}  # our own methods' params (lsprotocol types the others)
        self.initialized = False  # a valid initialize request was handled
        self.shutting_down = False  # the shutdown request came: only exit is taken now
        # called with a request's id, its error code (None: a result) and when its writing began,
        # once its answer is written (the server's timelines end there)
        self.on_answered = on_answered
        # called with a notification handler's failure and the method (the server shows it to the user)
        self.on_error = on_error
        self.on_dropped = on_dropped  # (method, why) of a malformed notification
        self._writer = None
        self.closed = False  # the client is gone: nothing more is written or read
        self._running: dict[Any, asyncio.Task] = {}  # request id -> its handler's task, until answered
        self._background: set[asyncio.Task] = set()  # async notification handlers, held until done
        self._waiting: dict[Any, tuple[asyncio.Future, type | None]] = {}  # our requests to the client
        self._ids = itertools.count(1)
        self._reading = 0.0  # when the message being dispatched was read
        self.read_at: dict = {}  # request id -> when it was read, until it is answered

    # --- the method table -------------------------------------------------------------------------

    def request(self, method: str, params: type | None = None) -> Callable[[Handler], Handler]:
        """Decorator: `handler(params)` answers `method`'s requests (its return value, awaited
        when it is a coroutine, is the result; RequestError is an error answer). `params`: the attrs
        class of a method of our own's params (register_params_type); lsprotocol types the others."""
        def register(handler: Handler) -> Handler:
            self.requests[method] = handler
            self._own_params(method, params)
            return handler
        return register

    def notification(self, method: str, params: type | None = None) -> Callable[[Handler], Handler]:
        """Decorator: `handler(params)` takes `method`'s notifications (`params`: as for request)."""
        def register(handler: Handler) -> Handler:
            self.notifications[method] = handler
            self._own_params(method, params)
            return handler
        return register

    def _own_params(self, method: str, params: type | None) -> None:
        if params is not None:
            register_params_type(self.converter, params)
            self.params_types[method] = params

    def _structure(self, method: str, params: Any) -> Any:
        """The params as their type (lsprotocol's, or one of ours: absent params are its defaults);
        as they came for a method nobody typed. Raises what cattrs raises on a bad field."""
        own = self.params_types.get(method)
        if own is not None:
            return self.converter.structure({} if params is None else params, own)
        params_type = _lsp_types(method)[2]
        return params if params_type is None else self.converter.structure(params, params_type)

    def in_flight(self) -> int:
        """Handlers still running, and our requests still waiting for the client (what the
        connection holds)."""
        return len(self._running) + len(self._background) + len(self._waiting)

    # --- reading ----------------------------------------------------------------------------------

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
                self.reply_error(data["id"], INTERNAL_ERROR, f"Internal error: {exc}")

    def refuse_oversized(self, head: bytes, length: int) -> None:
        msg_id = top_level_id(head)
        if msg_id in self._waiting:  # the client's answer to our request: fail it, answer nothing
            future, _ = self._waiting.pop(msg_id)
            if not future.done():
                future.set_exception(RequestError(INVALID_REQUEST, f"the answer was {length} bytes, over the limit"))
        elif msg_id is not None:
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
            self._receive_request(msg_id, method, data.get("params"))
        else:
            self._receive_notification(method, data.get("params"))

    def _receive_request(self, msg_id: Any, method: str, params: Any) -> None:
        if not usable_id(msg_id):
            self.reply_error(None, INVALID_REQUEST, f"Invalid request: id must be a number or a string, got "
                                                    f"{json.dumps(msg_id)[:40]}")
            return
        if refusal := self._refusal(msg_id, method, params):
            self.reply_error(msg_id, *refusal)
            return
        try:
            params = self._structure(method, params)
        except Exception as exc:  # noqa: BLE001 - cattrs reports a bad field in many ways
            self.reply_error(msg_id, INVALID_PARAMS, f"Invalid params for {method}: {_params_error(exc)}")
            return
        self.read_at[msg_id] = self._reading
        answered = self._run_request(msg_id, method, params)
        if method == types.INITIALIZE and answered:  # a failed one may be sent again
            self.initialized = True

    def _refusal(self, msg_id: Any, method: str, params: Any) -> tuple[int, str] | None:
        """Why a request is not handled at all, as (code, message); None when it is."""
        if self.shutting_down:
            return INVALID_REQUEST, "Invalid request: the server is shutting down"
        if method == types.INITIALIZE and self.initialized:
            return INVALID_REQUEST, "Invalid request: the server is initialized already"
        if method != types.INITIALIZE and not self.initialized:
            return SERVER_NOT_INITIALIZED, "Server not initialized: send initialize first"
        message_type, _, _ = _lsp_types(method)
        if method in self.notifications or (message_type is not None and not _is_request_type(message_type)):
            return INVALID_REQUEST, f"Invalid request: {method} is a notification; send it without an id"
        if method not in self.requests:
            return METHOD_NOT_FOUND, f"Method not found: {method}"
        if params is not None and not isinstance(params, (dict, list)):
            return INVALID_PARAMS, "Invalid params: params must be an object or an array"
        return None

    def _run_request(self, msg_id: Any, method: str, params: Any) -> bool:
        """Runs the handler; False when it failed at once (answered with an error)."""
        context = contextvars.copy_context()
        context.run(_request_id.set, msg_id)
        try:
            result = context.run(self.requests[method], params)
        except Exception as exc:  # noqa: BLE001 - answered as an error; the server goes on
            self._answer_failure(msg_id, method, exc)
            return False
        if not inspect.isawaitable(result):
            self._answer(msg_id, result)
            return True
        task = asyncio.get_running_loop().create_task(result, context=context)
        self._running[msg_id] = task
        task.add_done_callback(lambda done: self._answer_task(msg_id, method, done))
        return True

    def _answer_task(self, msg_id: Any, method: str, task: asyncio.Task) -> None:
        if self._running.get(msg_id) is task:
            del self._running[msg_id]
        if task.cancelled():
            self.reply_error(msg_id, REQUEST_CANCELLED, "Request cancelled")
        elif (exc := task.exception()) is not None:
            self._answer_failure(msg_id, method, exc)
        else:
            self._answer(msg_id, task.result())

    def _answer_failure(self, msg_id: Any, method: str, exc: BaseException) -> None:
        if isinstance(exc, RequestError):
            self.reply_error(msg_id, exc.code, str(exc))
        else:
            log.error("%s failed", method, exc_info=exc)
            self.reply_error(msg_id, INTERNAL_ERROR, f"Internal error in {method}: {exc}")

    def _receive_notification(self, method: str, params: Any) -> None:
        if method == types.CANCEL_REQUEST:
            self._cancel(params)
            return
        if method != types.EXIT and (self.shutting_down or not self.initialized):
            log.info("dropped %s: %s", method, "shutting down" if self.shutting_down else "not initialized yet")
            return
        handler = self.notifications.get(method)
        if handler is None:
            if method in self.requests:  # nobody waits for what it would return
                log.warning("ignored %s sent as a notification: it is a request, and needs an id", method)
            else:
                log.debug("ignored the notification %s, which this server does not handle", method)
            return
        try:
            params = self._structure(method, params)
        except Exception as exc:  # noqa: BLE001 - any bad shape: the message is dropped, the server goes on
            why = _params_error(exc)
            if self.on_dropped is not None:  # it logs and tells the user
                self.on_dropped(method, why)
            else:
                log.warning("dropped a %s notification with bad params: %s", method, why)
            return
        try:
            result = handler(params)
        except Exception as exc:  # noqa: BLE001 - the next message must still be handled
            self._failed(exc, method)
            return
        if inspect.isawaitable(result):
            task = asyncio.get_running_loop().create_task(result)
            self._background.add(task)
            task.add_done_callback(lambda done: self._notification_done(method, done))

    def _notification_done(self, method: str, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._failed(exc, method)

    def _failed(self, exc: BaseException, method: str) -> None:
        log.error("handling %s failed", method, exc_info=exc)
        if self.on_error is not None:
            try:
                self.on_error(exc, method)
            except Exception:  # noqa: BLE001 - telling the user failed too: the log has it
                log.exception("reporting the failure of %s failed", method)

    def _cancel(self, params: Any) -> None:
        """$/cancelRequest: the request's handler is cancelled, which answers it with -32800. A
        request answered already, or never seen, is left alone (its one answer is out, or none is due)."""
        msg_id = params.get("id") if isinstance(params, dict) else None
        task = self._running.get(msg_id) if usable_id(msg_id) else None
        if task is not None:
            task.cancel()
        else:
            log.debug("a cancel for %r, which is not running", msg_id)

    def _receive_response(self, data: dict) -> None:
        msg_id = data.get("id")
        waiting = self._waiting.pop(msg_id, None) if usable_id(msg_id) else None
        if waiting is None:
            log.warning("a response to an unknown request %r", msg_id)
            return
        future, response_type = waiting
        if future.done():  # the caller gave up waiting
            return
        if "error" in data:
            error = data["error"] if isinstance(data["error"], dict) else {}
            future.set_exception(RequestError(error.get("code", INTERNAL_ERROR) if isinstance(
                error.get("code"), int) else INTERNAL_ERROR, str(error.get("message", "an error"))))
            return
        result = data.get("result")
        if response_type is not None:
            try:
                result = self.converter.structure({"jsonrpc": "2.0", "id": msg_id, "result": result},
                                                  response_type).result
            except Exception:  # noqa: BLE001 - keep the raw result rather than leave the caller waiting
                pass
        future.set_result(result)

    # --- writing ----------------------------------------------------------------------------------

    def set_writer(self, writer) -> None:
        """`writer.write(body)` sends one message body as a frame (framing.FrameWriter)."""
        self._writer = writer

    def _send(self, message: dict) -> None:
        self._write(_encode(message))

    def _write(self, body: bytes) -> None:
        """One frame to the client. A connection that is gone is marked closed (serve() stops
        reading) instead of failing whichever handler wrote last."""
        if self.closed:
            return
        try:
            self._writer.write(body)
        except OSError as exc:  # BrokenPipeError, ConnectionResetError: the client is gone
            log.error("the connection to the client is lost (%s); shutting down", exc)
            self.closed = True

    def notify(self, method: str, params: Any = None) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = self.converter.unstructure(params)
        self._send(message)

    def send_request(self, method: str, params: Any = None) -> Awaitable:
        """A request to the client; await what it returns (RequestError when it answers an error)."""
        msg_id = f"memosight-{next(self._ids)}"
        future = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = (future, _lsp_types(method)[1])
        future.add_done_callback(lambda _: self._waiting.pop(msg_id, None))  # answered, or given up on
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = self.converter.unstructure(params)
        self._send(message)
        return future

    def _answer(self, msg_id: Any, result: Any) -> None:
        try:
            body = _encode({"jsonrpc": "2.0", "id": msg_id, "result": self.converter.unstructure(result)})
        except (TypeError, ValueError) as exc:  # the result is not JSON: the request still gets its answer
            log.error("the answer to %r is not JSON: %s", msg_id, exc)
            self.reply_error(msg_id, INTERNAL_ERROR, f"Internal error: the result is not JSON ({exc})")
            return
        self._reply(msg_id, body, error_code=None)

    def reply_error(self, msg_id: int | str | None, code: int, message: str) -> None:
        self._reply(msg_id, _encode({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}),
                    error_code=code)

    def _reply(self, msg_id: Any, body: bytes, error_code: int | None) -> None:
        """Writes the one answer to `msg_id`, then tells the server (on_answered)."""
        self.read_at.pop(msg_id, None)
        writing = time.perf_counter()
        self._write(body)
        if self.on_answered is None or msg_id is None:
            return
        try:
            self.on_answered(msg_id, error_code, writing)
        except Exception:  # noqa: BLE001 - the figures are the server's; the answer is out already
            log.exception("the server's hook for the answer to %r failed", msg_id)


async def serve(read: Callable[[int], Awaitable[bytes]], connection: Connection,
                stop: threading.Event | None = None, max_body: int = MAX_MESSAGE_BYTES) -> None:
    """Read and handle messages until the stream ends (or `stop` is set)."""
    framer = Framer(read, max_body)
    while (stop is None or not stop.is_set()) and not connection.closed:
        try:
            body, head = await framer.next_body()
        except EOFError:
            return
        if body is None:
            connection.refuse_oversized(head, framer.skipped[-1])
            continue
        connection.receive(body)
