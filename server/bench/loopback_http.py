"""One HTTP POST as llama.vim's curl jobs make it, over a raw asyncio connection (no new
dependency): cancelling the task drops the connection, as llama.vim's jobstop does."""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import urlsplit


async def post_json(url: str, body: dict, headers: dict) -> tuple[str, bool]:
    """curl --silent: the response body (any status) and whether the transfer worked."""
    parts = urlsplit(url)
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
            f"Content-Length: {len(data)}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    except OSError:
        return "", False
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        await writer.drain()
        raw = await reader.read()
    except OSError:
        return "", False
    finally:
        writer.close()
    header, _, payload = raw.partition(b"\r\n\r\n")
    # "Transfer-Encoding: chunked" in any spacing and case, also after another coding ("gzip, chunked")
    if re.search(rb"^transfer-encoding:[^\r\n]*\bchunked\b", header, re.IGNORECASE | re.MULTILINE):
        out, rest = b"", payload
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0] or b"0", 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        payload = out
    return payload.decode("utf-8", "replace"), bool(header)
