"""A streamed HTTP POST that reads server-sent events, and errors a user can act on.

Standard library only (http.client, ssl): a remote engine must not need torch or an HTTP package.
Closing an `EventStream` closes its socket at once, which is how a server learns that nobody wants
the rest of a completion (llama.cpp, vLLM and SGLang stop generating when the client goes away).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

from ..protocol import EngineError

MAX_ERROR_CHARS = 300


class RemoteError(EngineError):
    """A request to a serving engine failed. `kind`: unreachable, auth, tls, bad_request,
    not_found, timeout, server, protocol."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _proxy_for(url: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The proxy HTTPS_PROXY / HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    if urllib.request.proxy_bypass(url.hostname or ""):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}") if proxy else None


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


class EventStream(Iterator[dict]):
    """The JSON objects of a server-sent event stream (`data: {...}` lines; `[DONE]` ends it). A
    plain JSON answer (a server that does not stream) is one event."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse,
                 deadline: float, url: str, read_timeout_s: float | None = None):
        self._connection, self._response = connection, response
        self._deadline, self._url = deadline, url
        # The socket keeps the first-token timeout until the first event: a streaming server sends
        # its headers at once and its first token only after the prompt (seconds, for a cold one on
        # a CPU). After it, each read may take up to the whole request's bound.
        self._read_timeout_s = read_timeout_s
        self._first = True
        self._lines = self._read_lines()
        self.closed = False
        self.done = False  # the server said the stream is over ([DONE]), not just closed it

    def _read_lines(self) -> Iterator[dict]:
        if "text/event-stream" not in (self._response.getheader("Content-Type") or ""):
            self.done = True
            yield json.loads(self._response.read() or b"{}")
            return
        while True:
            if time.monotonic() > self._deadline:
                raise RemoteError("timeout", f"the server at {self._url} took longer than the request timeout "
                                             "(backend.timeout_ms)")
            line = self._response.readline()
            if not line:
                return
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # comments, event names, blank separators
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise RemoteError("protocol", f"the server at {self._url} sent an event that is not JSON: "
                                              f"{data[:80]!r}") from exc
            if isinstance(event, dict) and "error" in event:
                raise RemoteError("server", f"the server at {self._url} failed: {_server_reason(data)}")
            yield event

    def __next__(self) -> dict:
        try:
            event = next(self._lines)
            if self._first:
                self._first = False
                sock = self._connection.sock
                if sock is not None and self._read_timeout_s is not None:
                    sock.settimeout(self._read_timeout_s)
            return event
        except StopIteration:
            raise
        except Exception as exc:
            if self.closed:  # closed by us (a cancel, from another thread) while reading: the end
                raise StopIteration from None
            raise self._error(exc) from exc

    def _error(self, exc: Exception) -> RemoteError:
        """What a failed read means for the user."""
        if isinstance(exc, RemoteError):
            return exc
        if isinstance(exc, (TimeoutError, socket.timeout)):
            if self._first:
                return RemoteError("timeout", f"the server at {self._url} sent no token within the first-token "
                                              "timeout (backend.first_token_timeout_ms)")
            return RemoteError("timeout", f"the server at {self._url} stopped sending (timeout)")
        if isinstance(exc, (ConnectionError, http.client.HTTPException, OSError)):
            return RemoteError("unreachable", f"the connection to {self._url} broke ({exc})")
        return RemoteError("protocol", f"the stream from {self._url} could not be read ({exc!r})")

    def close(self) -> None:
        self.closed = True
        try:
            self._lines.close()
        except ValueError:  # "generator already executing": another thread is reading; the socket below ends it
            pass
        try:
            sock = self._connection.sock
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)  # at once, even while another thread reads
        except OSError:
            pass
        self._connection.close()


def post_stream(url: str, body: dict, headers: dict[str, str], *, timeout_s: float, first_token_timeout_s: float,
                ca_bundle: str = "") -> EventStream:
    """POST `body` as JSON to `url` and return its event stream, or raise a RemoteError that says
    what went wrong and which setting fixes it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError("bad_request", f"backend.url {url!r} is not an http:// or https:// URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = _proxy_for(parts)
    context = None
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if ca_bundle:
            try:
                context.load_verify_locations(ca_bundle)
            except (OSError, ssl.SSLError) as exc:
                raise RemoteError("tls", f"backend.ca_bundle {ca_bundle!r} cannot be read as CA certificates "
                                         f"({exc})") from exc
    host, conn_port = (proxy.hostname, proxy.port or 8080) if proxy else (parts.hostname, port)
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(host, conn_port, timeout=first_token_timeout_s, context=context)
        if proxy:
            connection.set_tunnel(parts.hostname, port)
    else:
        connection = http.client.HTTPConnection(host, conn_port, timeout=first_token_timeout_s)
    path = url if proxy and parts.scheme == "http" else (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    payload = json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
    try:
        connection.request("POST", path, body=payload, headers=all_headers)
        response = connection.getresponse()
    except ssl.SSLError as exc:
        connection.close()
        raise RemoteError("tls", f"TLS with {parts.hostname} failed ({exc.reason or exc}); for a server with its "
                                 "own certificate authority set backend.ca_bundle to its CA file") from exc
    except (TimeoutError, socket.timeout) as exc:
        connection.close()
        raise RemoteError("timeout", f"the server at {url} sent nothing within the first-token timeout") from exc
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise RemoteError("unreachable", f"cannot reach the server at {url} ({exc}); is it running, and is "
                                         "backend.url right?") from exc
    if response.status >= 400:
        reason = _server_reason(response.read())
        connection.close()
        if response.status in (401, 403):
            raise RemoteError("auth", f"the server at {url} refused the credentials (HTTP {response.status}): "
                                      "check the API key in the environment variable named by backend.api_key_env")
        if response.status == 404:
            raise RemoteError("not_found", f"the server at {url} answered 404 ({reason}): check backend.url and "
                                           "backend.model")
        if response.status < 500:
            raise RemoteError("bad_request", f"the server at {url} refused the request (HTTP {response.status}): "
                                             f"{reason}")
        raise RemoteError("server", f"the server at {url} failed (HTTP {response.status}): {reason}")
    return EventStream(connection, response, time.monotonic() + timeout_s, url, read_timeout_s=max(0.1, timeout_s))
