"""The server under seeded random input (hypothesis): valid edits with any characters, messages of
every wrong shape to every method it offers, junk between frames, config files and settings of any
shape. Each request is answered exactly once, the server's text equals LSP's model of it, and the
server is alive and completing at the end.

Bounded for CI (MEMOSIGHT_FUZZ_EXAMPLES examples per test, 40 by default); a longer run:
MEMOSIGHT_FUZZ_EXAMPLES=1000 python -m pytest tests/server/test_fuzz.py"""

from __future__ import annotations

import asyncio
import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memosight.server.lsp import create_server

from .conftest import RawClient, ScriptedEngine
from .lsp_model import FUZZ_EXAMPLES, LspText, edits

FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
URI = "file:///fuzz/a.py"
OTHER = "file:///fuzz/b.py"
ANSWER_CODES = {-32600, -32601, -32602, -32800}  # -32603 (internal error) would be the server's bug

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from(["", "\ud800", "\x00", "file:///x%00.py", "😀" * 3]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)

# A valid message for every method the server offers (but exit and shutdown, which end it), and
# whether it is a request.
TEMPLATES = {
    "textDocument/inlineCompletion": (True, {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 2},
                                             "context": {"triggerKind": 1}}),
    "textDocument/completion": (True, {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 2},
                                       "context": {"triggerKind": 2, "triggerCharacter": "."}}),
    "memosight/status": (True, {}),
    "workspace/executeCommand": (True, {"command": "memosight.accepted", "arguments": [3]}),
    "textDocument/didOpen": (False, {"textDocument": {"uri": OTHER, "languageId": "python", "version": 1,
                                                      "text": "y = 2\n"}}),
    "textDocument/didChange": (False, {"textDocument": {"uri": URI, "version": 9}, "contentChanges": [
        {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}}, "text": "z"}]}),
    "textDocument/didClose": (False, {"textDocument": {"uri": OTHER}}),
    "textDocument/didSave": (False, {"textDocument": {"uri": URI}}),
    "workspace/didChangeConfiguration": (False, {"settings": {"memosight": {"maxNewTokens": 3}}}),
    "workspace/didChangeWatchedFiles": (False, {"changes": [{"uri": URI, "type": 2}]}),
    "$/cancelRequest": (False, {"id": 5}),
    "$/setTrace": (False, {"value": "off"}),
}


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 120))


async def started(engine=None, root=None) -> RawClient:
    engine = engine if engine is not None else ScriptedEngine()
    client = RawClient(create_server(load_engine=lambda settings: engine))
    answer = await client.request("init", "initialize", {"processId": None, "capabilities": {},
                                                         "rootUri": root.as_uri() if root else None,
                                                         "initializationOptions": {"maxNewTokens": 3}})
    assert "result" in answer
    client.notify("initialized", {})
    return client


async def alive_and_completing(client: RawClient) -> None:
    """The server answers, takes a new document and completes in it."""
    assert "result" in await client.request("final-status", "memosight/status")
    uri = "file:///fuzz/final.py"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": "def f():\n    return 1\n"}})
    answer = await client.request("final", "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}})
    assert answer["result"]["items"][0]["insertText"] == "xxx", answer


def answered_once(client: RawClient, ids: list) -> None:
    for msg_id in ids:
        assert client.answers.get(json.dumps(msg_id)) == 1, (msg_id, client.answers)
    for message in client.received:
        if "error" in message and message.get("id") not in (None, "init"):
            assert message["error"]["code"] in ANSWER_CODES, message


def paths(value, prefix=()):
    """Every place in a JSON value: dict keys and list indices."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


@st.composite
def mutated(draw, params):
    """`params` with one place replaced by any JSON value, removed, or given an extra member."""
    params = copy.deepcopy(params)
    places = [p for p in paths(params) if p]
    if not places:
        return draw(json_values)
    place = draw(st.sampled_from(places))
    parent = params
    for step in place[:-1]:
        parent = parent[step]
    how = draw(st.sampled_from(["replace", "remove", "extra"]))
    if how == "replace" or (how == "remove" and isinstance(parent, list)):
        parent[place[-1]] = draw(json_values)
    elif how == "remove":
        del parent[place[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=6))] = draw(json_values)
    return params


@st.composite
def bad_messages(draw):
    method = draw(st.sampled_from(sorted(TEMPLATES)))
    is_request, template = TEMPLATES[method]
    params = draw(mutated(template)) if draw(st.booleans()) else template
    as_request = is_request if draw(st.integers(0, 5)) else not is_request  # sometimes the wrong kind
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    if draw(st.integers(0, 5)) == 0:
        del message["params"]
    return as_request, message


@FUZZ
@given(st.lists(bad_messages(), min_size=1, max_size=12))
def test_messages_of_any_shape_to_every_method_are_answered_once(messages):
    async def scenario():
        client = await started()
        client.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "python", "version": 1,
                                                                "text": "import os\nx = os.pa\n"}})
        ids = []
        for i, (as_request, message) in enumerate(messages):
            if as_request:
                message["id"] = i
                ids.append(i)
            client.send(message)
        for msg_id in ids:
            await client.answer(msg_id)
        await alive_and_completing(client)
        answered_once(client, ids)
        assert len(client.popups()) <= 5
        await client.close()
    run(scenario)


junk = st.one_of(
    st.binary(max_size=64).map(lambda b: b.replace(b"Content-Length", b"X")),  # a body of bytes
    json_values.map(lambda v: json.dumps(v).encode()),  # JSON, but no message
    st.sampled_from([b"[" * 50_000 + b"]" * 50_000, b'{"jsonrpc":"2.0","id":1e400,"method":"x"}',
                     b'{"jsonrpc":"2.0","id":NaN}', b"\xff\xfe\x00", b'{"jsonrpc":"2.0","method":"' + b"a" * 10_000 + b'"}',
                     b'{"jsonrpc":"2.0","id":"x","result":' + b"1" * 5000 + b"}"]),
)
header_noise = st.sampled_from([b"", b"Content-Type: text/plain\r\n", b"X-Whatever: 1\r\n", b"content-length: 0\r\n"])


@FUZZ
@given(st.lists(st.tuples(header_noise, junk), min_size=1, max_size=8))
def test_junk_bodies_and_headers_between_frames_leave_the_server_serving(frames):
    async def scenario():
        client = await started()
        for noise, body in frames:
            client.send_raw(noise + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await alive_and_completing(client)
        await client.close()
    run(scenario)


def wire(text: str) -> str:
    """The text as it arrives: JSON escapes a high and a low surrogate side by side as one character."""
    return json.loads(json.dumps(text))


@FUZZ
@given(st.data())
def test_edits_through_the_server_keep_its_text_equal_to_the_client_s(data):
    async def scenario():
        client = await started()
        model = LspText(wire(data.draw(edits.documents())))
        client.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "python", "version": 1,
                                                                "text": model.text}})
        for version in range(2, 2 + data.draw(st.integers(1, 6))):
            changes = []
            for _ in range(data.draw(st.integers(1, 3))):  # several changes in one message apply in order
                start, end, text = data.draw(edits.change(model))
                text = wire(text)
                model.apply(start, end, text)
                changes.append({"range": {"start": {"line": start[0], "character": start[1]},
                                          "end": {"line": end[0], "character": end[1]}}, "text": text})
            client.notify("textDocument/didChange", {"textDocument": {"uri": URI, "version": version},
                                                     "contentChanges": changes})
        await client.request("sync", "memosight/status")
        assert client.server.documents.get(URI).text == model.text
        lines = model.lines()
        line = data.draw(st.integers(0, len(lines) - 1))
        position = model.position(line, data.draw(st.integers(0, len(lines[line][1]))))
        answer = await client.request("c", "textDocument/completion", {
            "textDocument": {"uri": URI}, "position": {"line": position[0], "character": position[1]}})
        items = answer["result"]["items"]
        if items:  # the edit ends at the cursor and starts at the word before it, on the cursor's line
            edit_range = items[0]["textEdit"]["range"]
            assert edit_range["end"] == {"line": position[0], "character": position[1]}
            assert edit_range["start"]["line"] == position[0] and edit_range["start"]["character"] <= position[1]
        await client.close()
    run(scenario)


config_text = st.one_of(
    st.text(max_size=200),
    json_values.map(lambda v: f"model = {json.dumps(v)}\ncontext_budget = {json.dumps(v)}\n"),
    st.sampled_from(["x = " + "[" * 3000 + "]" * 3000, "[tool.memosight]\nlanguages = 5\n", "\x00\x01",
                     'max_new_tokens = 99999999999999999999999\n', "log_level = 'DEBUG'\nsuffix_share = inf\n"]),
)


@FUZZ
@given(config_text, st.dictionaries(st.text(max_size=20), json_values, max_size=6), json_values)
def test_config_files_and_settings_of_any_shape_leave_the_server_completing(tmp_path_factory, file_text,
                                                                           init_settings, client_settings):
    root = tmp_path_factory.mktemp("config")

    async def scenario():
        (root / ".memosight.toml").write_text(file_text, encoding="utf-8", errors="surrogatepass")
        client = await started(root=root)
        client.notify("workspace/didChangeConfiguration", {"settings": {"memosight": client_settings}})
        client.notify("workspace/didChangeConfiguration", {"settings": {"memosight": {**init_settings,
                                                                                     "maxNewTokens": 3,
                                                                                     "model": None}}})
        await alive_and_completing(client)
        assert len(client.popups()) <= 5
        await client.close()
    run(scenario)
