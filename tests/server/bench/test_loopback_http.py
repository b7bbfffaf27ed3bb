"""One HTTP POST as llama.vim's curl jobs make it (loopback_http.py), against small servers on
127.0.0.1: what it sends, plain and chunked bodies, any status, failures as ("", False), a body cut
short, and a cancelled task dropping the connection."""

from __future__ import annotations

import asyncio
import json

from memosight.server.bench.loopback_http import post_json


async def raw_server(respond):
    """An asyncio server on 127.0.0.1: `respond(request_bytes, writer)` answers each connection (the
    whole request read first); returns (server, url, requests received)."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        request = head + await reader.readexactly(length)
        received.append(request)
        await respond(request, writer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", received


def reply(status: str, body: bytes, *headers: str):
    async def respond(request, writer):
        writer.write(("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode() + body)
    return respond


async def test_the_request_is_compact_utf8_json_with_curls_headers_and_the_body_comes_back():
    body = json.dumps({"content": "été ✓"}, ensure_ascii=False).encode()
    server, url, received = await raw_server(
        reply("200 OK", body, "Content-Type: application/json", f"Content-Length: {len(body)}"))
    async with server:
        text, ok = await post_json(url + "/infill", {"prompt": "é", "n": [1, 2]}, {"Authorization": "Bearer k"})
    assert (text, ok) == ('{"content": "été ✓"}', True)
    head, _, sent = received[0].partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    port = url.rsplit(":", 1)[1]
    assert lines[0] == "POST /infill HTTP/1.1"
    assert set(lines[1:]) == {f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
                              f"Content-Length: {len(sent)}", "Connection: close", "Authorization: Bearer k"}
    # as llama.vim's json_encode: no spaces, UTF-8 as is (not \u escapes); the length in bytes
    assert sent == '{"prompt":"é","n":[1,2]}'.encode()


async def test_a_url_without_a_path_posts_to_the_root():
    server, url, received = await raw_server(reply("200 OK", b"{}", "Content-Length: 2"))
    async with server:
        assert await post_json(url, {}, {}) == ("{}", True)
    assert received[0].startswith(b"POST / HTTP/1.1\r\n")


async def test_a_chunked_body_is_joined_and_its_chunk_extensions_ignored():
    chunked = b"5\r\nhello\r\n7;name=v\r\n, world\r\n0\r\n\r\n"
    server, url, _ = await raw_server(reply("200 OK", chunked, "Transfer-Encoding: chunked"))
    async with server:
        assert await post_json(url + "/x", {}, {}) == ("hello, world", True)
    server, url, _ = await raw_server(reply("200 OK", chunked, "transfer-encoding:chunked"))  # any spacing, case
    async with server:
        assert await post_json(url + "/x", {}, {}) == ("hello, world", True)


async def test_an_error_status_still_gives_its_body_as_curl_silent_does():
    server, url, _ = await raw_server(reply("503 Service Unavailable", b'{"error":"loading"}', "Content-Length: 19"))
    async with server:
        assert await post_json(url + "/infill", {}, {}) == ('{"error":"loading"}', True)


async def test_no_server_or_no_answer_is_a_failed_transfer():
    async def nothing(request, writer):
        pass  # the connection closes without a byte of answer

    server, url, _ = await raw_server(nothing)
    async with server:
        assert await post_json(url + "/infill", {}, {}) == ("", False)
    # the port is free again once the server is closed: the connection is refused
    assert await post_json(url + "/infill", {}, {}) == ("", False)


async def test_a_body_cut_short_is_a_failed_transfer_with_what_came_of_it():
    # as curl --silent: what arrived goes to stdout, and the job ends in an error
    server, url, _ = await raw_server(reply("200 OK", b'{"con', "Content-Length: 19"))
    async with server:
        assert await post_json(url + "/infill", {}, {}) == ('{"con', False)


async def test_cancelling_the_task_drops_the_connection():
    connected, left = asyncio.Event(), asyncio.Event()

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        connected.set()
        # never answer: read() ends only when the client closes its end of the connection
        await asyncio.wait_for(reader.read(), 5)
        left.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/infill"
    async with server:
        task = asyncio.create_task(post_json(url, {"prompt": "x"}, {}))
        await asyncio.wait_for(connected.wait(), 5)
        task.cancel()
        await asyncio.wait_for(left.wait(), 5)  # as llama.vim's jobstop: the server sees the client leave
    assert task.cancelled()
