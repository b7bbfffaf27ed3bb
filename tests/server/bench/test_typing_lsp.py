"""memosight-lsp as `memosight bench typing` types into it (typing_lsp.py): LSP positions in UTF-16,
a process's CPU seconds, and the Neovim client's logic (debounce, one request in flight, answers
shown only for the buffer as it is, Tab reported) against a stand-in server that logs what it gets:
no memosight-lsp process, whose torch import alone would cost seconds."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from memosight.server.bench import typing_lsp
from memosight.server.bench.lsp_client import LspProcess
from memosight.server.bench.typing_lsp import LspSystem, position_of, process_cpu_seconds

from .stand_in_lsp import stand_in_server

# A stand-in for memosight-lsp: logs every message to argv[1], answers an inline completion with
# "<line:character>" at once, except one asked at character 6, which it holds until the client
# cancels it (then the LSP "request cancelled" error, as a real server answers), and answers
# memosight/status with fixed figures.
FAKE_SERVER = stand_in_server('''
    log = open(sys.argv[1], "a")
    held = set()
''', '''
    log.write(json.dumps(message) + "\\n")
    log.flush()
    method, params = message.get("method"), message.get("params")
    if method == "exit":
        sys.exit(0)
    if method == "$/cancelRequest" and params["id"] in held:
        held.discard(params["id"])
        send({"jsonrpc": "2.0", "id": params["id"], "error": {"code": -32800, "message": "cancelled"}})
    if "id" not in message:
        continue
    if method == "textDocument/inlineCompletion":
        at = params["position"]
        if at["character"] == 6:
            held.add(message["id"])
            continue
        result = {"items": [{"insertText": "<%d:%d>" % (at["line"], at["character"])}]}
    elif method == "memosight/status":
        result = {"requests": {"typed_through": 3, "joined": 1, "superseded": 2, "other": 9},
                  "completion_cache": {"hits": 4}, "peak_rss_mb": 123.5}
    else:
        result = None
    send({"jsonrpc": "2.0", "id": message["id"], "result": result})
''')


def test_positions_count_lines_and_utf16_code_units():
    text = "ab\ncé😀d\n"
    assert position_of(text, 0) == {"line": 0, "character": 0}
    assert position_of(text, 2) == {"line": 0, "character": 2}
    assert position_of(text, 3) == {"line": 1, "character": 0}  # just after the newline
    # é is one UTF-16 unit, 😀 two (a surrogate pair): 4 characters in Python, 5 units in LSP
    assert position_of(text, text.index("\n", 3)) == {"line": 1, "character": 5}


def test_cpu_seconds_are_the_processes_user_and_system_time_and_zero_when_unknown():
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn some CPU, so the figure is not just start-up
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    mine = process_cpu_seconds(os.getpid())
    assert mine >= 0.3 and abs(mine - (usage.ru_utime + usage.ru_stime)) < 0.1  # /proc counts in clock ticks
    assert process_cpu_seconds(None) == 0.0 and process_cpu_seconds(0) == 0.0
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: its /proc entry is gone
    assert process_cpu_seconds(ended.pid) == 0.0


async def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def logged(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_the_client_logic_against_a_stand_in_server(tmp_path, monkeypatch):
    log = tmp_path / "server.jsonl"
    launched = []

    class StandIn(LspProcess):
        """The command LspSystem builds is recorded; the stand-in server runs instead."""

        def __init__(self, command, env=None):
            launched.append((command, env))
            super().__init__([sys.executable, "-c", FAKE_SERVER, str(log)], env)

    monkeypatch.setattr(typing_lsp, "LspProcess", StandIn)
    cpu_readings = [1.25, 4.0]  # the model process's CPU seconds after the warm-up, then at the end
    monkeypatch.setattr(typing_lsp, "process_cpu_seconds",
                        lambda pid: cpu_readings.pop(0) if pid == system.lsp.proc.pid else pytest.fail(pid))
    system = LspSystem("memosight", {"model": "tiny"}, root="file:///w", log_file=str(tmp_path / "lsp.log"))
    (command, env), = launched
    assert command == [sys.executable, "-m", "memosight.server", "--stdio", "--log-file", str(tmp_path / "lsp.log"),
                       "--log-level", "debug"]
    assert env["HF_HUB_OFFLINE"] == os.environ.get("HF_HUB_OFFLINE", "1")

    # start: initialize with the options, then one warm-up completion answered before the first key
    await system.start()
    assert system.first_answer_s > 0
    await until(lambda: len(logged(log)) >= 5)  # the warm-up's didClose is sent without waiting
    methods = [m.get("method") for m in logged(log)]
    assert methods[:5] == ["initialize", "initialized", "textDocument/didOpen", "textDocument/inlineCompletion",
                           "textDocument/didClose"]
    assert logged(log)[0]["params"]["initializationOptions"] == {"model": "tiny"}
    assert logged(log)[0]["params"]["rootUri"] == "file:///w"
    started = len(logged(log))

    path = tmp_path / "m.py"
    text, cursor = "x = \n", 4
    await system.open(str(path), text, cursor)
    uri = path.resolve().as_uri()

    async def key(inserted: str, accepted: bool = False) -> None:
        nonlocal text, cursor
        text, cursor = text[:cursor] + inserted + text[cursor:], cursor + len(inserted)
        await system.edit(text, cursor, inserted, accepted)

    await key("1")
    assert system.visible() == ""  # nothing until the debounce has passed and the answer came
    await until(lambda: system.visible())
    assert system.visible() == "<0:5>" and len(system.stats.latencies_ms) == 1
    assert system.stats.latencies_ms[0] >= 50  # the client's 50 ms debounce comes first

    # "2" is asked at character 6 and held; "3" makes that answer stale: the client cancels it
    await key("2")
    assert system.visible() == ""  # the shown suggestion was for the buffer before this key
    await until(lambda: any((m.get("params") or {}).get("position", {}).get("character") == 6 for m in logged(log)))
    await key("3")
    await until(lambda: system.visible() == "<0:7>")
    await key("<0:7>", accepted=True)  # Tab: the suggestion goes in and is reported
    await until(lambda: system.visible() == "<0:12>")
    await system.close(str(path))
    assert system.visible() == ""
    stats = await system.stop()

    messages = logged(log)[started:]
    by_method = lambda method: [m for m in messages if m.get("method") == method]  # noqa: E731
    opened, = by_method("textDocument/didOpen")
    assert opened["params"]["textDocument"] == {"uri": uri, "languageId": "python", "version": 1, "text": "x = \n"}
    visited, = by_method("memosight/visited")
    assert visited["params"] == {"textDocument": {"uri": uri}, "line": 0, "entered": True}
    changes = [(m["params"]["textDocument"]["version"], m["params"]["contentChanges"]) for m in by_method(
        "textDocument/didChange")]
    at = lambda c: {"start": {"line": 0, "character": c}, "end": {"line": 0, "character": c}}  # noqa: E731
    # each insertion at the position it went in at, in the buffer before it; versions count up from the open's 1
    assert changes == [(2, [{"range": at(4), "text": "1"}]), (3, [{"range": at(5), "text": "2"}]),
                       (4, [{"range": at(6), "text": "3"}]), (5, [{"range": at(7), "text": "<0:7>"}])]
    asked = by_method("textDocument/inlineCompletion")
    assert [m["params"]["position"]["character"] for m in asked] == [5, 6, 7, 12]
    assert all(m["params"]["context"] == {"triggerKind": 2} and m["params"]["textDocument"]["uri"] == uri
               for m in asked)
    held_id = asked[1]["id"]
    assert [m["params"]["id"] for m in by_method("$/cancelRequest")] == [held_id]
    accepted, = by_method("workspace/executeCommand")
    assert accepted["params"] == {"command": "memosight.accepted", "arguments": [5]}
    assert [m["params"]["textDocument"]["uri"] for m in by_method("textDocument/didClose")] == [uri]
    assert [m.get("method") for m in messages[-3:]] == ["memosight/status", "shutdown", "exit"]

    # the figures: requests asked while typing (not the warm-up), one latency per suggestion shown
    assert stats.requests == 4 and len(stats.latencies_ms) == 3
    assert stats.model_cpu_s == 2.75 and cpu_readings == []  # the typing's share: the end's less the start's
    assert stats.notes == {"typed_through": 3, "joined": 1, "superseded": 2, "completion_cache": {"hits": 4},
                           "first_answer_s": round(system.first_answer_s, 2), "server_peak_rss_mb": 123.5}
