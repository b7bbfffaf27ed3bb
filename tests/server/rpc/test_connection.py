"""The JSON-RPC layer: every request answered once with the right code, bounded reads, no popups
per bad message. Raw bytes go to the real server in this process (tests/server/conftest.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from memosight.server.rpc.connection import (
    INVALID_PARAMS,
    Connection,
    RequestError,
    current_request_id,
    serve,
)

POSITION = {"line": 0, "character": 3}


def inline_params(position=POSITION, trigger_kind=1, uri=None):
    return {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": trigger_kind}}


async def opened(client, tmp_path, text="def f():\n    return 1\n"):
    await client.initialize(tmp_path)
    uri = (tmp_path / "a.py").as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": text}})
    return uri


async def test_status_without_params_and_a_request_with_extra_members_are_answered(tmp_path, raw_client):
    client = raw_client()
    await client.initialize(tmp_path)
    assert "result" in await client.request(310, "memosight/status")
    assert "result" in await client.request(311, "memosight/status", {}, extra={"x": 1})


BAD_PARAMS = [
    ("line -1", inline_params({"line": -1, "character": 0})),
    ("character 1e20", inline_params({"line": 0, "character": 1e20})),
    ("line 2**32", inline_params({"line": 4294967296, "character": 0})),
    ("position null", inline_params(None)),
    ("position a string", inline_params("0:3")),
    ("position an array", inline_params([0, 3])),
    ("triggerKind 99", inline_params(trigger_kind=99)),
    ("params []", []),
    ("params {}", {}),
    ("params missing", None),
]


@pytest.mark.parametrize("name,params", BAD_PARAMS, ids=[name for name, _ in BAD_PARAMS])
async def test_requests_with_bad_params_get_invalid_params_and_no_popup(tmp_path, raw_client, name, params):
    client = raw_client()
    uri = await opened(client, tmp_path)
    if isinstance(params, dict) and "textDocument" in params:
        params["textDocument"]["uri"] = uri
    answer = await client.request(7, "textDocument/inlineCompletion", params)
    assert answer["error"]["code"] == -32602, answer
    assert "Invalid params" in answer["error"]["message"]
    assert "result" in await client.request(8, "memosight/status")  # still serving
    assert client.answers == {'"init"': 1, "7": 1, "8": 1}
    assert client.popups() == []


@pytest.mark.parametrize("params", ["x", 42, True])
async def test_params_that_are_not_an_object_or_array_are_invalid_params(tmp_path, raw_client, params):
    client = raw_client()
    await client.initialize(tmp_path)
    client.send({"jsonrpc": "2.0", "id": 1, "method": "memosight/status", "params": params})
    assert (await client.answer(1))["error"]["code"] == -32602


async def test_unknown_methods_get_method_not_found_and_unknown_notifications_nothing(tmp_path, raw_client):
    client = raw_client()
    await client.initialize(tmp_path)
    client.notify("$/somethingElse", {"a": 1})
    client.notify("custom/whatever")
    assert (await client.request(1, "custom/whatever"))["error"]["code"] == -32601
    assert (await client.request(2, "$/request"))["error"]["code"] == -32601
    assert client.answers == {'"init"': 1, "1": 1, "2": 1} and client.popups() == []


async def test_requests_before_initialize_get_server_not_initialized(tmp_path, raw_client):
    client = raw_client()
    assert (await client.request(1, "memosight/status"))["error"]["code"] == -32002
    assert (await client.request(2, "textDocument/inlineCompletion", inline_params()))["error"]["code"] == -32002
    assert "result" in await client.initialize(tmp_path)


async def test_a_second_initialize_is_refused_and_documents_keep_syncing(tmp_path, raw_client):
    client = raw_client()
    uri = await opened(client, tmp_path)
    again = await client.request(2, "initialize", {"processId": None, "rootUri": tmp_path.as_uri(),
                                                   "capabilities": {}})
    assert again["error"]["code"] == -32600
    client.notify("textDocument/didChange", {
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                            "text": "# top\n"}]})
    await client.request(3, "memosight/status")
    assert client.server.documents.get(uri).text == "# top\ndef f():\n    return 1\n"


async def test_requests_after_shutdown_get_invalid_request(tmp_path, raw_client):
    client = raw_client()
    await client.initialize(tmp_path)
    assert "result" in await client.request(1, "shutdown")
    assert (await client.request(2, "memosight/status"))["error"]["code"] == -32600


@pytest.mark.parametrize("body", [b'{"jsonrpc":"2.0","id":NaN,"method":"memosight/status"}',
                                  b'{"jsonrpc":"2.0","id":Infinity,"method":"memosight/status"}',
                                  b'{"jsonrpc":"2.0","id":1,"method":"memosight/status"',
                                  b'\xff\xfe not json',
                                  b"[" * 100_000 + b"]" * 100_000])
async def test_bodies_that_are_not_strict_json_get_a_parse_error_with_id_null(tmp_path, raw_client, body):
    client = raw_client()
    await client.initialize(tmp_path)
    client.send(None, raw_body=body)
    answer = await client.answer(None)  # the reply itself must be strict JSON: RawClient.next checks
    assert answer["error"]["code"] == -32700
    assert "result" in await client.request(2, "memosight/status")


@pytest.mark.parametrize("message,code", [
    ({"jsonrpc": "2.0", "id": 1.5, "method": "memosight/status"}, -32600),
    ({"jsonrpc": "2.0", "id": True, "method": "memosight/status"}, -32600),
    ({"jsonrpc": "2.0", "id": None, "method": "memosight/status"}, -32600),
    ({"jsonrpc": "1.0", "id": 1, "method": "memosight/status"}, -32600),
    ({"jsonrpc": "2.0", "id": 1, "method": 5}, -32600),
    ([{"jsonrpc": "2.0", "id": 1, "method": "memosight/status"}], -32600),
    ("just a string", -32600),
])
async def test_malformed_envelopes_get_invalid_request(tmp_path, raw_client, message, code):
    client = raw_client()
    await client.initialize(tmp_path)
    client.send(message)
    answer = await client.next()
    assert answer["error"]["code"] == code
    assert "result" in await client.request(2, "memosight/status")


async def test_a_huge_content_length_is_refused_and_the_next_message_is_read(tmp_path, raw_client):
    client = raw_client()
    await client.initialize(tmp_path)
    client.send_raw(b"Content-Length: 1000000000000\r\n\r\n")
    assert "result" in await client.request(5, "memosight/status")
    assert client.answers == {'"init"': 1, "5": 1}


async def test_a_request_over_the_size_limit_is_skipped_and_answered_by_its_id(tmp_path, raw_client):
    client = raw_client(max_body=2000)
    await client.initialize(tmp_path)
    client.send({"jsonrpc": "2.0", "id": 9, "method": "memosight/status", "params": {"pad": "x" * 5000}})
    answer = await client.answer(9)
    assert answer["error"]["code"] == -32600 and "limit" in answer["error"]["message"]
    assert "result" in await client.request(10, "memosight/status")
    assert client.server.documents.all() == []


async def test_a_header_line_without_end_is_dropped_and_reading_goes_on(tmp_path, raw_client):
    client = raw_client()
    await client.initialize(tmp_path)
    client.send_raw(b"X" * 100_000 + b"\r\n")
    assert "result" in await client.request(3, "memosight/status")


async def test_a_malformed_notification_is_dropped_with_one_message_and_no_flood(tmp_path, raw_client):
    client = raw_client()
    uri = await opened(client, tmp_path)
    for i in range(50):
        client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": i},
                                                 "contentChanges": [{"range": {"start": {"line": -1}}}]})
        client.notify("textDocument/didOpen", {"textDocument": {"uri": f"{uri}{i}"}})
    await client.request(1, "memosight/status")
    assert 1 <= len(client.popups()) <= 5
    assert client.server.documents.get(uri).text == "def f():\n    return 1\n"


async def test_cancelled_requests_get_request_cancelled(tmp_path, raw_client, scripted_engine):
    client = raw_client(engine=scripted_engine(delay=0.05))
    uri = await opened(client, tmp_path)
    client.send({"jsonrpc": "2.0", "id": 4, "method": "textDocument/inlineCompletion",
                 "params": inline_params(uri=uri)})
    await asyncio.to_thread(client.engine.running.wait, 10)
    client.notify("$/cancelRequest", {"id": 4})
    assert (await client.answer(4))["error"]["code"] == -32800
    assert client.answers == {'"init"': 1, "4": 1}


async def test_notifications_leave_nothing_behind_in_the_protocol(tmp_path, raw_client):
    client = raw_client()
    uri = await opened(client, tmp_path)
    for version in range(2, 302):  # nothing (a task, its params) may stay per notification
        client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                                 "contentChanges": [{"text": f"def f():\n    return {version}\n"}]})
    client.notify("workspace/didChangeConfiguration", {"settings": {"memosight": {"maxNewTokens": 4}}})
    assert "result" in await client.request(1, "textDocument/inlineCompletion", inline_params(uri=uri))
    assert "result" in await client.request(2, "memosight/status")  # what finished is dropped by then
    assert client.server.connection.in_flight() == 0  # each handler dropped once it answered


@pytest.mark.parametrize("error", [-1, 30])
async def test_a_wrong_content_length_costs_that_message_and_later_ones_are_read(tmp_path, raw_client, error):
    client = raw_client()
    await client.initialize(tmp_path)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "memosight/status", "params": {"x": "é"}}).encode()
    client.send_raw(f"Content-Length: {len(body) + error}\r\n\r\n".encode() + body)  # counted in characters, say
    client.send({"jsonrpc": "2.0", "id": 2, "method": "memosight/status"})  # its header may be eaten too
    for msg_id in (3, 4, 5):
        assert "result" in await client.request(msg_id, "memosight/status")


class Captured:
    """A Connection's writer: the message bodies it sent, parsed."""

    def __init__(self):
        self.messages: list[dict] = []

    def write(self, body: bytes) -> None:
        self.messages.append(json.loads(body))

    def answer(self, msg_id) -> dict:
        [answer] = [m for m in self.messages if m.get("id") == msg_id and "method" not in m]
        return answer


def body(msg_id, method, params=None) -> bytes:
    message = {"jsonrpc": "2.0", "method": method, **({"id": msg_id} if msg_id is not None else {})}
    return json.dumps({**message, **({"params": params} if params is not None else {})}).encode()


async def test_a_connection_answers_each_request_once_from_sync_async_failing_and_cancelled_handlers():
    failed = []
    connection, out = Connection(on_error=lambda exc, method: failed.append((method, str(exc)))), Captured()
    connection.set_writer(out)
    release = asyncio.Event()
    connection.request("initialize")(lambda params: {"root": params.root_uri})  # typed by lsprotocol
    connection.request("x/echo")(lambda params: params)  # our own method: the params as sent
    connection.request("x/nan")(lambda params: {"share": float("nan")})  # not JSON: still answered

    @connection.request("x/whoami")
    async def whoami(params):
        await asyncio.sleep(0)
        return current_request_id()  # the request's own id, across an await

    @connection.request("x/refuse")
    def refuse(params):
        raise RequestError(INVALID_PARAMS, "not that")

    @connection.request("x/crash")
    async def crash(params):
        raise RuntimeError("boom")

    @connection.request("x/wait")
    async def wait(params):
        await release.wait()

    @connection.notification("x/note")
    async def note(params):
        raise ValueError("bad note")

    connection.receive(body(1, "initialize", {"processId": None, "rootUri": "file:///w", "capabilities": {}}))
    for msg_id, method in [(2, "x/echo"), (3, "x/whoami"), (4, "x/refuse"), (5, "x/crash"), (6, "x/wait"),
                           (7, "x/nan")]:
        connection.receive(body(msg_id, method, {"n": msg_id}))
    connection.receive(body(None, "x/note", {}))
    connection.receive(body(None, "$/cancelRequest", {"id": 6}))
    for _ in range(5):
        await asyncio.sleep(0)
    assert out.answer(1)["result"] == {"root": "file:///w"}
    assert out.answer(2)["result"] == {"n": 2}
    assert out.answer(3)["result"] == 3
    assert out.answer(4)["error"] == {"code": INVALID_PARAMS, "message": "not that"}
    assert out.answer(5)["error"]["code"] == -32603 and "boom" in out.answer(5)["error"]["message"]
    assert out.answer(6)["error"]["code"] == -32800
    assert out.answer(7)["error"]["code"] == -32603 and "not JSON" in out.answer(7)["error"]["message"]
    assert failed == [("x/note", "bad note")]
    assert len(out.messages) == 7  # one answer per request, none for the notification or the cancel
    assert connection.in_flight() == 0


async def test_a_request_is_answered_once_even_when_the_servers_hook_fails():
    connection, out = Connection(on_answered=lambda msg_id, code, writing: 1 / 0), Captured()  # a hook that fails
    connection.set_writer(out)
    connection.request("initialize")(lambda params: None)
    read_at = []

    @connection.request("textDocument/inlineCompletion")
    async def complete(params):
        read_at.append(connection.read_at[current_request_id()])  # when it was read off the wire
        return {"items": []}
    connection.receive(body(1, "initialize", {"processId": None, "capabilities": {}}))
    connection.receive(body(2, "textDocument/inlineCompletion", {
        "textDocument": {"uri": "file:///a.py"}, "position": {"line": 0, "character": 0},
        "context": {"triggerKind": 1}}))
    for _ in range(3):
        await asyncio.sleep(0)
    assert [m.get("result") for m in out.messages] == [None, {"items": []}]
    assert connection.read_at == {} and len(read_at) == 1 and read_at[0] > 0


async def test_a_failed_initialize_may_be_sent_again():
    connection, out, tries = Connection(), Captured(), []
    connection.set_writer(out)

    @connection.request("initialize")
    def initialize(params):
        tries.append(1)
        if len(tries) == 1:
            raise RequestError(INVALID_PARAMS, "not yet")
    for msg_id in (1, 2, 3):
        connection.receive(body(msg_id, "initialize", {"processId": None, "capabilities": {}}))
    assert [m.get("error", {}).get("code") for m in out.messages] == [INVALID_PARAMS, None, -32600]


async def test_a_client_that_is_gone_ends_the_session_instead_of_failing_each_handler():
    class Gone:
        def write(self, body):
            raise BrokenPipeError("the client closed its end")
    connection = Connection()
    connection.set_writer(Gone())
    connection.request("initialize")(lambda params: None)
    frames = [b"Content-Length: %d\r\n\r\n" % len(b) + b for b in (
        body(1, "initialize", {"processId": None, "capabilities": {}}), body(2, "x/never", {}))]

    async def read(n: int) -> bytes:
        return frames.pop(0) if frames else b""
    await asyncio.wait_for(serve(read, connection), 5)
    assert connection.closed and frames  # it stopped reading at once


async def test_an_answer_from_the_client_over_the_size_limit_fails_our_request_and_is_not_answered():
    connection, out = Connection(), Captured()
    connection.set_writer(out)
    asked = connection.send_request("workspace/configuration", {"items": []})
    huge = json.dumps({"jsonrpc": "2.0", "id": out.messages[0]["id"], "result": ["x" * 4000]}).encode()
    frames = [b"Content-Length: %d\r\n\r\n" % len(huge) + huge]

    async def read(n: int) -> bytes:
        return frames.pop(0) if frames else b""
    await serve(read, connection, max_body=1000)
    with pytest.raises(RequestError, match="over the limit"):
        await asyncio.wait_for(asked, 1)
    assert len(out.messages) == 1 and connection.in_flight() == 0


async def test_a_request_to_the_client_given_up_on_is_dropped():
    connection, out = Connection(), Captured()
    connection.set_writer(out)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(connection.send_request("workspace/configuration", {"items": []}), 0.01)
    assert connection.in_flight() == 0


async def test_initialize_states_the_capabilities_and_utf16_whatever_the_client_prefers(tmp_path, raw_client):
    client = raw_client()
    answer = await client.request("init", "initialize", {
        "processId": None, "rootUri": tmp_path.as_uri(),
        "capabilities": {"general": {"positionEncodings": ["utf-8", "utf-16"]}}})  # Neovim's list
    assert answer["result"] == {
        "capabilities": {"positionEncoding": "utf-16",  # documents.py counts UTF-16 units
                         "textDocumentSync": {"openClose": True, "change": 2, "save": True},
                         "inlineCompletionProvider": {},
                         "completionProvider": {"triggerCharacters": [".", "(", " "]},
                         "executeCommandProvider": {"commands": ["memosight.accepted"]}},
        "serverInfo": {"name": "memosight", "version": answer["result"]["serverInfo"]["version"]}}


async def test_a_connection_matches_the_client_s_answers_to_its_own_requests():
    connection, out = Connection(), Captured()
    connection.set_writer(out)
    asked = connection.send_request("workspace/configuration", {"items": [{"section": "memosight"}]})
    failing = connection.send_request("client/registerCapability", {"registrations": []})
    first, second = out.messages
    assert first["method"] == "workspace/configuration" and first["params"] == {"items": [{"section": "memosight"}]}
    connection.receive(json.dumps({"jsonrpc": "2.0", "id": second["id"],
                                   "error": {"code": -32601, "message": "no"}}).encode())
    connection.receive(json.dumps({"jsonrpc": "2.0", "id": first["id"], "result": [{"model": "m"}]}).encode())
    assert list(await asked) == [{"model": "m"}]
    with pytest.raises(RequestError) as refused:
        await failing
    assert refused.value.code == -32601
    connection.receive(json.dumps({"jsonrpc": "2.0", "id": first["id"], "result": []}).encode())  # again: ignored
    assert len(out.messages) == 2  # nothing is sent back for a response


async def test_execute_command_counts_what_was_accepted_and_refuses_other_commands(tmp_path, raw_client):
    client = raw_client()
    uri = await opened(client, tmp_path)

    async def accept(msg_id, *arguments):
        assert (await client.request(msg_id, "workspace/executeCommand", {"command": "memosight.accepted",
                                                                          "arguments": list(arguments)}))["result"] is None
        requests = (await client.request(f"s{msg_id}", "memosight/status"))["result"]["requests"]
        return requests["accepted"], requests["accepted_chars"]

    assert await accept(1, 7) == (0, 0)  # nothing was suggested yet: nothing can have been taken
    shown = (await client.request(2, "textDocument/inlineCompletion", inline_params({"line": 1, "character": 12},
                                                                                    uri=uri)))["result"]["items"]
    length = len(shown[0]["insertText"])
    assert length > 7
    assert await accept(3, 7) == (1, 7)
    assert await accept(4, 7) == (1, 7)  # one suggestion, taken once
    again = await client.request(5, "textDocument/inlineCompletion", inline_params({"line": 0, "character": 8},
                                                                                   uri=uri))
    longest = max(length, len(again["result"]["items"][0]["insertText"]))
    # a client's number that cannot be true (it sent 4e30 once) counts as the longest suggestion
    assert await accept(6, 4 * 10**30) == (2, 7 + longest)
    refused = await client.request(7, "workspace/executeCommand", {"command": "other.thing"})
    assert refused["error"]["code"] == -32602 and "memosight.accepted" in refused["error"]["message"]
