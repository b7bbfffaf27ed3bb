"""The small LSP client of the benchmarks: framing, ids, notifications, server requests, a dead server."""

import asyncio
import sys

from memosight.server.bench.lsp_client import LspProcess

from .stand_in_lsp import stand_in_server

# A stand-in server: answers each request with its method and params, sends a notification and a
# request of its own first, and dies on "die".
ECHO_SERVER = stand_in_server("", '''
    if message.get("method") == "die":
        sys.exit(1)
    if "id" in message and "method" in message:
        send({"jsonrpc": "2.0", "method": "note", "params": {"about": message["method"]}})
        send({"jsonrpc": "2.0", "id": "srv-1", "method": "workspace/configuration", "params": {}})
        if message["method"] == "fail":
            send({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32602, "message": "bad params"}})
        else:
            send({"jsonrpc": "2.0", "id": message["id"], "result": [message["method"], message["params"]]})
''')


def test_requests_get_their_own_answers_and_notifications_are_kept():
    async def scenario():
        lsp = LspProcess([sys.executable, "-c", ECHO_SERVER])
        await lsp.start()
        first, second = await asyncio.gather(lsp.call("a", {"n": 1}), lsp.call("b", ["é"]))
        try:
            await lsp.call("fail", None)
        except RuntimeError as exc:
            failed = str(exc)
        notes = [params["about"] for method, params in lsp.notifications if method == "note"]
        lsp.notify("die", None)
        _, pending = lsp.request("after-death", None)
        try:
            await asyncio.wait_for(pending, 10)
        except ConnectionError as exc:
            dead = str(exc)
        await lsp.stop()
        return first, second, failed, notes, dead

    first, second, failed, notes, dead = asyncio.run(scenario())
    assert first == ["a", {"n": 1}] and second == ["b", ["é"]]
    assert failed == "bad params"
    assert notes == ["a", "b", "fail"]
    assert "closed the connection" in dead
