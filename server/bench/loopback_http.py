"""One HTTP POST as llama.vim's curl jobs make it, on httpx: cancelling the task drops the
connection, as llama.vim's jobstop does."""

from __future__ import annotations

import json

import httpx


async def post_json(url: str, body: dict, headers: dict) -> tuple[str, bool]:
    """curl --silent: the response body (any status) and whether the transfer worked; what came of
    a body cut short, with False."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    received = bytearray()
    # curl's job has no timeout (the bench cancels it), and a bench on loopback takes no proxy
    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        for name in ("Accept", "Accept-Encoding", "User-Agent"):  # httpx's own; llama.vim's request has none
            del client.headers[name]
        # the space around a value is no part of it, and h11 refuses to send it ("Bearer " without a key)
        headers = {"Content-Type": "application/json", "Connection": "close",
                   **{name: value.strip() for name, value in headers.items()}}
        try:
            async with client.stream("POST", url, content=data, headers=headers) as response:
                async for chunk in response.aiter_raw():  # as curl without --compressed: as sent
                    received += chunk
        except httpx.TransportError:
            return received.decode("utf-8", "replace"), False
    return received.decode("utf-8", "replace"), True
