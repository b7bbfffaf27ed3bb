"""A streamed HTTP POST that reads server-sent events, and errors a user can act on.

On httpx (no torch): proxies come from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY, TLS trusts the
system's certificate authorities and backend.ca_bundle. Closing an `EventStream` closes its socket at
once, even while another thread waits in a read: that is how a server learns that nobody wants the
rest of a completion (llama.cpp, vLLM and SGLang stop generating when the client goes away).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator

import httpx

from ..protocol import EngineError

MAX_ERROR_CHARS = 300
# The longest line (and event) read. llama.cpp's last event repeats the whole prompt, a long one a
# few hundred KiB of JSON; beyond this a server is misbehaving, and is not buffered any further.
MAX_LINE_BYTES = 8 << 20
MAX_ERROR_BODY_BYTES = 64 << 10  # of a refused request's body: its reason is in the first few lines

FIRST_TOKEN_TIMEOUT = "first_token"
REQUEST_TIMEOUT = "request"


class RemoteError(EngineError):
    """A request to a serving engine failed. `kind`: unreachable, auth, tls, bad_request,
    not_found, timeout, server, protocol."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _server_reason(body: bytes) -> str:
    """The server's own words for a refused request (OpenAI-style {"error": {"message"}} or text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
        error = data.get("error", data) if isinstance(data, dict) else data
        text = error.get("message", text) if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    return text[:MAX_ERROR_CHARS] or "no reason given"


# --- server-sent events ---------------------------------------------------------------------------
# Neither httpx's iter_lines() nor httpx-sse bounds a line: a server that never ends one would be
# buffered until memory runs out. So the lines are split here, over the raw chunks, with a bound.

_LINE_END = re.compile(rb"\r\n|\r|\n")  # all three, as the SSE spec says


def _lines(chunks: Iterable[bytes], limit: int, url: str) -> Iterator[bytes]:
    """The lines of `chunks` without their ends; a line longer than `limit` bytes is a RemoteError."""
    def too_long() -> RemoteError:
        return RemoteError("protocol", f"the server at {url} sent a line longer than {limit} bytes "
                                       "(the bound on one line of its event stream)")

    partial: list[bytes] = []  # the line being read, in pieces
    size = 0
    after_cr = False
    for chunk in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the rest of a \r\n split between two chunks
        after_cr = chunk.endswith(b"\r")
        *ended, rest = _LINE_END.split(chunk)
        for piece in ended:
            line = b"".join(partial) + piece if partial else piece
            partial, size = [], 0
            if len(line) > limit:
                raise too_long()
            yield line
        if rest:
            partial.append(rest)
            size += len(rest)
            if size > limit:
                raise too_long()
    if partial:
        yield b"".join(partial)  # the last line, without its end


def _event_data(lines: Iterable[bytes], limit: int, url: str) -> Iterator[bytes]:
    """The data of each event: its `data:` fields joined with "\\n", as the SSE spec says. Comments
    (`:`), event names, ids and retry times are of no use here and are skipped."""
    data: list[bytes] = []
    size = 0
    for line in lines:
        if not line:  # a blank line ends an event
            if data:
                yield b"\n".join(data)
            data, size = [], 0
            continue
        name, _, value = line.partition(b":")
        if name != b"data":
            continue
        value = value[1:] if value.startswith(b" ") else value
        data.append(value)
        size += len(value) + 1
        if size > limit:
            raise RemoteError("protocol", f"the server at {url} sent an event longer than {limit} bytes")
    if data:  # the spec drops an event the stream ends in; a server that forgot the blank line meant it
        yield b"\n".join(data)


def _read_at_most(chunks: Iterable[bytes], limit: int) -> tuple[bytes, bool]:
    """The bytes of `chunks`, up to `limit`, and whether there were more."""
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False


# --- the connection and its deadlines -------------------------------------------------------------

class _Watch:
    """The socket under one request, to shut from any thread, and a thread that shuts it when a
    deadline passes: first the first-token deadline (until the first event), then the whole
    request's. httpx bounds each read, not the wait for a first event that comes after the headers,
    nor a server that keeps sending past the request's bound."""

    def __init__(self, first_token_timeout_s: float):
        self.passed = ""  # FIRST_TOKEN_TIMEOUT or REQUEST_TIMEOUT: why the watch shut the connection
        self._stream = None  # httpcore's network stream, from the trace extension, then the response
        self._due = time.monotonic() + first_token_timeout_s
        self._why = FIRST_TOKEN_TIMEOUT
        self._then: float | None = None  # the whole request's deadline, once the headers are in
        self._stopped = False
        self._changed = threading.Condition()
        threading.Thread(target=self._run, daemon=True, name="memosight-sse-deadline").start()

    def trace(self, name: str, info: dict) -> None:
        """httpcore's `trace` extension: the stream the connection has at each step (TCP, then TLS)."""
        if name.endswith((".connect_tcp.complete", ".start_tls.complete")):
            self._stream = info.get("return_value")

    def responded(self, response: httpx.Response, request_deadline: float) -> None:
        self._stream = response.extensions.get("network_stream", self._stream)
        self._then = request_deadline

    def first_event(self) -> bool:
        """The first event is in: the whole request's deadline from now on. False when it came after
        the first-token deadline, which the watch thread had not acted on yet (a busy machine)."""
        with self._changed:
            if self._why == FIRST_TOKEN_TIMEOUT and time.monotonic() > self._due:
                self.passed = FIRST_TOKEN_TIMEOUT
                return False
            if self._then is not None:
                self._due, self._why = self._then, REQUEST_TIMEOUT
                self._changed.notify()
            return True

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def shut(self) -> None:
        """Shut the socket down: a read in any thread ends at once, and the server sees the client leave."""
        sock = self._stream.get_extra_info("socket") if self._stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                # socket.socket's own shutdown, also for a TLS socket: SSLSocket.shutdown would first
                # drop its SSL object under the feet of a thread reading through it
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def _run(self) -> None:
        with self._changed:
            while not self._stopped:
                left = self._due - time.monotonic()
                if left <= 0:
                    self.passed = self._why
                    self.shut()
                    return
                self._changed.wait(left)


@functools.lru_cache(maxsize=4)
def _tls_context(ca_bundle: str) -> ssl.SSLContext:
    """The system's CAs (as curl and the standard library trust them, not httpx's own certifi list),
    plus `ca_bundle`. Made once per bundle: loading the system's CAs takes tens of milliseconds, on
    every request otherwise, and httpx wants a context even for http://."""
    context = ssl.create_default_context()
    if ca_bundle:
        try:
            context.load_verify_locations(ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise RemoteError("tls", f"backend.ca_bundle {ca_bundle!r} cannot be read as CA certificates "
                                     f"({exc})") from exc
    return context


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure under an httpx error, if that is what it is."""
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# --- the stream -----------------------------------------------------------------------------------

class EventStream(Iterator[dict]):
    """The JSON objects of a server-sent event stream (`data:` fields; `[DONE]` ends it). A plain
    JSON answer (a server that does not stream) is one event. Made by post_stream."""

    def __init__(self, client: httpx.Client, response: httpx.Response, watch: _Watch, url: str):
        self._client, self._response, self._watch, self._url = client, response, watch, url
        self._first = True
        self._released = False
        self._release_lock = threading.Lock()
        self._events = self._read()
        self.closed = False
        self.done = False  # the server said the stream is over ([DONE]), not just closed it

    def _read(self) -> Iterator[dict]:
        chunks = self._response.iter_bytes()
        if "text/event-stream" not in self._response.headers.get("Content-Type", ""):
            body, more = _read_at_most(chunks, MAX_LINE_BYTES)
            self._raise_if_late()
            if more:
                raise RemoteError("protocol", f"the server at {self._url} answered with more than "
                                              f"{MAX_LINE_BYTES} bytes (the bound on one answer)")
            self.done = True
            yield self._event(body or b"{}")
            return
        for data in _event_data(_lines(chunks, MAX_LINE_BYTES, self._url), MAX_LINE_BYTES, self._url):
            if data.strip() == b"[DONE]":
                self.done = True
                return
            yield self._event(data)
        self._raise_if_late()

    def _raise_if_late(self) -> None:
        """A body that runs to the connection's end (no length, not chunked) ends without an error
        when the watch shuts the connection: the deadline is the error."""
        if self._watch.passed:
            raise self._error(None)

    def _event(self, data: bytes) -> dict:
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise RemoteError("protocol", f"the server at {self._url} sent an event that is not JSON: "
                                          f"{data[:80]!r}") from exc
        if isinstance(event, dict) and "error" in event:
            raise RemoteError("server", f"the server at {self._url} failed: {_server_reason(data)}")
        return event

    def __next__(self) -> dict:
        try:
            event = next(self._events)
        except StopIteration:
            self.close()
            raise
        except Exception as exc:
            error = None if self.closed else self._error(exc)  # closed by us while reading: the end
            self.close()
            if error is None:
                raise StopIteration from None
            raise error from exc
        if self.closed:  # by another thread, while this one was between reads
            self.close()
            raise StopIteration
        if self._first:
            self._first = False
            if not self._watch.first_event():
                self.close()
                raise _no_first_token(self._url)
        return event

    def _error(self, exc: Exception | None) -> RemoteError:
        """What a failed read (or a deadline, `exc` None) means for the user."""
        if isinstance(exc, RemoteError):
            return exc
        if self._watch.passed == FIRST_TOKEN_TIMEOUT or (self._first and isinstance(exc, httpx.TimeoutException)):
            return _no_first_token(self._url)
        if self._watch.passed == REQUEST_TIMEOUT:
            return RemoteError("timeout", f"the server at {self._url} took longer than the request timeout "
                                          "(backend.timeout_ms)")
        if isinstance(exc, httpx.TimeoutException):
            return RemoteError("timeout", f"the server at {self._url} stopped sending (timeout)")
        if isinstance(exc, (httpx.TransportError, OSError)):
            return RemoteError("unreachable", f"the connection to {self._url} broke ({exc})")
        return RemoteError("protocol", f"the stream from {self._url} could not be read ({exc!r})")

    def close(self) -> None:
        """Close the connection at once; from any thread, also while another one reads."""
        self.closed = True
        self._watch.stop()
        self._watch.shut()
        try:
            self._events.close()
        except ValueError:  # "generator already executing": the reading thread wakes to the shut
            return  # socket and releases the rest itself (httpx's objects are not for two threads)
        self._release()

    def _release(self) -> None:
        with self._release_lock:
            if self._released:
                return
            self._released = True
        with contextlib.suppress(httpx.TransportError, OSError):
            self._response.close()
        with contextlib.suppress(httpx.TransportError, OSError):
            self._client.close()


def _no_first_token(url: str) -> RemoteError:
    return RemoteError("timeout", f"the server at {url} sent no token within the first-token timeout "
                                  "(backend.first_token_timeout_ms)")


def _refused(response: httpx.Response, url: str) -> RemoteError:
    """The RemoteError for an HTTP error status, with the server's own reason."""
    status = response.status_code
    reason = _server_reason(_read_at_most(response.iter_bytes(), MAX_ERROR_BODY_BYTES)[0])
    if status in (401, 403):
        return RemoteError("auth", f"the server at {url} refused the credentials (HTTP {status}): check the "
                                   "API key in the environment variable named by backend.api_key_env")
    if status == 404:
        return RemoteError("not_found", f"the server at {url} answered 404 ({reason}): check backend.url and "
                                        "backend.model")
    if status < 500:
        return RemoteError("bad_request", f"the server at {url} refused the request (HTTP {status}): {reason}")
    return RemoteError("server", f"the server at {url} failed (HTTP {status}): {reason}")


def _unsent(exc: Exception, url: str, host: str, watch: _Watch) -> RemoteError:
    """The RemoteError for a request that got no answer."""
    if watch.passed or isinstance(exc, httpx.TimeoutException):
        return _no_first_token(url)
    if (tls := _ssl_error(exc)) is not None:
        return RemoteError("tls", f"TLS with {host} failed ({tls.reason or tls}); for a server with its own "
                                  "certificate authority set backend.ca_bundle to its CA file")
    if isinstance(exc, httpx.LocalProtocolError):  # a header h11 will not send
        return RemoteError("bad_request", f"the request to {url} cannot be sent ({exc}): check the API key in "
                                          "the environment variable named by backend.api_key_env")
    if isinstance(exc, httpx.ProxyError):
        return RemoteError("unreachable", f"the proxy refused the connection to {url} ({exc}); check "
                                          "HTTPS_PROXY / HTTP_PROXY, or name the host in NO_PROXY")
    return RemoteError("unreachable", f"cannot reach the server at {url} ({exc}); is it running, and is "
                                      "backend.url right?")


def post_stream(url: str, body: dict, headers: dict[str, str], *, timeout_s: float, first_token_timeout_s: float,
                ca_bundle: str = "") -> EventStream:
    """POST `body` as JSON to `url` and return its event stream, or raise a RemoteError that says
    what went wrong and which setting fixes it. `first_token_timeout_s` bounds the wait for the
    first event (connecting included); `timeout_s`, the stream from the headers on."""
    try:
        parts = urllib.parse.urlsplit(url)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL):
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError("bad_request", f"backend.url {url!r} is not an http:// or https:// URL")
    # The deadlines are the watch's; httpx's timeouts only bound a connect and a single read or write
    per_read_s = max(0.1, timeout_s, first_token_timeout_s)
    context = _tls_context(ca_bundle)
    try:
        client = httpx.Client(verify=context, trust_env=True,
                              timeout=httpx.Timeout(per_read_s, connect=first_token_timeout_s))
    except ImportError as exc:  # ALL_PROXY=socks5://...: httpx's SOCKS support is an extra
        raise RemoteError("unreachable", f"a SOCKS proxy is set ({exc}); install httpx[socks], or unset "
                                         "ALL_PROXY") from exc
    except (ValueError, httpx.InvalidURL) as exc:
        raise RemoteError("unreachable", f"the proxy settings (HTTPS_PROXY / HTTP_PROXY / ALL_PROXY) cannot be "
                                         f"used ({exc})") from exc
    watch = _Watch(first_token_timeout_s)
    # identity: a compressed stream would hold tokens back. The space around a value is no part of it,
    # and h11 refuses to send it (a key read with its newline)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity",
               **{name: value.strip() for name, value in headers.items()}}
    request = client.build_request("POST", url, content=json.dumps(body).encode(), headers=headers,
                                   extensions={"trace": watch.trace})
    try:
        response = client.send(request, stream=True)
    except httpx.TransportError as exc:
        watch.stop()
        client.close()
        raise _unsent(exc, url, parts.hostname, watch) from exc
    watch.responded(response, time.monotonic() + timeout_s)
    if response.status_code >= 400:
        try:
            error = _refused(response, url)
        except httpx.TransportError as exc:
            error = _unsent(exc, url, parts.hostname, watch)
        watch.stop()
        response.close()
        client.close()
        raise error
    return EventStream(client, response, watch, url)
