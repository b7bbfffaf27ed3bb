"""LSP's framing on the wire: reading frames within bounds, writing them whole.

Every message is read within bounds: header lines of MAX_HEADER_LINE bytes, bodies of
MAX_MESSAGE_BYTES; a longer body is skipped without being held, and a lying Content-Length is
recovered from at the next header. Frames are written whole under a lock; on stdio the write
blocks while the client does not read (backpressure: nothing piles up in the server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_HEADER_LINE = 8 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 50 MB file opened in full still fits
CONTENT_LENGTH = re.compile(rb"Content-Length:[ \t]*(\d{1,20})[ \t]*\r?\n", re.IGNORECASE)


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


class FrameWriter:
    """Writes whole frames to a byte stream (stdout: from any thread, blocking while the client
    does not read) or to anything with write(bytes) (an asyncio StreamWriter, on the event loop's
    thread only; a test pipe)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._flush = getattr(stream, "flush", None)  # a StreamWriter has none: the loop sends it
        self._lock = threading.Lock()

    def write(self, body: bytes) -> None:
        frame = memoryview(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        with self._lock:
            while frame:
                written = self._stream.write(frame)
                if written is None:  # a buffered stream or a StreamWriter: it took it all
                    break
                frame = frame[written:]  # unbuffered stdout (python -u) may take part of it
            if self._flush is not None:
                self._flush()


def stdin_reader(stdin, executor) -> Callable[[int], Awaitable[bytes]]:
    """read(n) on a binary stream, off the event loop: at most n bytes, whatever has arrived."""
    read = getattr(stdin, "read1", stdin.read)

    def read_some(n: int) -> Awaitable[bytes]:
        return asyncio.get_running_loop().run_in_executor(executor, read, n)
    return read_some
