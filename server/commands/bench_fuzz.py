"""`memosight bench fuzz [--seeds 5] [--messages 10000] [--json]`: a hostile client, at scale, on a real server.

For each seed a fresh `memosight-lsp --stdio` (the embedded model, or --model) gets the seeded stream
of fuzz_stream.py as fast as it reads it, then `exit` without `shutdown`. Checked for every seed:
every well-formed request was answered exactly once; every document the server holds equals the
client's copy (memosight/status {"digests": true}); it still completes in a new document; it exits
on `exit`. Reported per seed: those checks, the messages by kind, seconds, and the server's peak
resident memory (VmHWM: the most it ever held).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import sys
import time

from ..documents import text_digest
from .common import CommandError, add_json_argument, print_result, process_memory_mb, say
from .fuzz_stream import SCRATCH, FuzzStream, encode, frame
from .lsp_client import read_frame

ANSWER_TIMEOUT_S = 180.0  # for the last answers after the stream, a cold model included


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=5, help="runs, seeds 0..N-1 (default 5; 0: the stalled client alone)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--messages", type=int, default=10_000, help="messages a run (default 10000)")
    parser.add_argument("--model", help="model for the server (default: the embedded model)")
    parser.add_argument("--huge-mb", type=float, default=12.0, help="size of the huge documents (default 12 MB)")
    parser.add_argument("--stalled-requests", type=int, default=3000,
                        help="then a client that sends this many requests while not reading (0: none)")
    parser.add_argument("--stall-s", type=float, default=20.0, help="how long it does not read (default 20 s)")
    parser.add_argument("--server-log", metavar="PREFIX", help="write each run's server log to PREFIX-SEED.log")
    add_json_argument(parser)


class RawServer:
    """memosight-lsp over pipes, written to in raw bytes; every frame it sends is read and counted."""

    def __init__(self, command: list[str]):
        self.command = command
        self.answers: collections.Counter = collections.Counter()  # json.dumps(id) -> answers
        self.results: dict[str, dict] = {}  # the answers to the harness's own checks, by id
        self.messages_shown = 0
        self.bad_frames = 0  # frames from the server that are not strict JSON-RPC
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, log_path: str | None) -> None:
        stderr = open(log_path, "wb") if log_path else asyncio.subprocess.DEVNULL
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}, limit=2**26)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (body := await read_frame(self.proc.stdout)) is not None:
            try:
                message = json.loads(body)
            except (ValueError, TypeError):
                self.bad_frames += 1
                continue
            if "method" in message and "id" in message:  # the server asks something: null is an answer
                await self.write(frame(encode({"jsonrpc": "2.0", "id": message["id"], "result": None})))
            elif message.get("method") == "window/showMessage":
                self.messages_shown += 1
            elif "id" in message:
                key = json.dumps(message["id"])
                self.answers[key] += 1
                if isinstance(message["id"], str) and message["id"].startswith("check-"):
                    self.results[message["id"]] = message

    async def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def check(self, name: str, method: str, params) -> dict:
        msg_id = f"check-{name}"
        await self.write(frame(encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})))
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while msg_id not in self.results:
            if time.monotonic() > deadline or self.reader.done():
                raise TimeoutError(f"no answer to {method}")
            await asyncio.sleep(0.02)
        return self.results[msg_id]


async def fuzz_one(seed: int, args) -> dict:
    command = [sys.executable, "-m", "memosight.server", "--stdio"]
    server = RawServer(command)
    await server.start(f"{args.server_log}-{seed}.log" if args.server_log else None)
    stream = FuzzStream(seed, args.huge_mb)
    kinds: collections.Counter = collections.Counter()
    expected: list[str] = []
    started = time.perf_counter()
    options = {"model": args.model} if args.model else {}
    await server.write(frame(encode({"jsonrpc": "2.0", "id": "check-init", "method": "initialize", "params": {
        "processId": os.getpid(), "rootUri": None, "capabilities": {}, "initializationOptions": options}})))
    await server.write(frame(encode({"jsonrpc": "2.0", "method": "initialized", "params": {}})))
    crashed = None
    try:
        for message in stream.opening() + [stream.next() for _ in range(args.messages)]:
            kinds[message.kind] += 1
            if message.request_id is not None:
                expected.append(json.dumps(message.request_id))
            await server.write(message.data)
        sent_s = time.perf_counter() - started
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while any(server.answers[k] == 0 for k in expected) and time.monotonic() < deadline \
                and not server.reader.done():
            await asyncio.sleep(0.05)
        digests = (await server.check("digests", "memosight/status", {"digests": True}))["result"]["digests"]
        final = "file:///fuzz/final.py"
        await server.write(frame(encode({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
            "textDocument": {"uri": final, "languageId": "python", "version": 1,
                             "text": "def add(a, b):\n    return a + b\n\n\ndef main():\n    \n"}}})))
        completion = await server.check("final", "textDocument/inlineCompletion", {
            "textDocument": {"uri": final}, "position": {"line": 5, "character": 4}, "context": {"triggerKind": 1}})
    except (ConnectionError, TimeoutError, BrokenPipeError) as exc:
        crashed, digests, completion, sent_s = str(exc), {}, {}, time.perf_counter() - started
    peak = process_memory_mb(server.proc.pid, "VmHWM")
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        await server.write(frame(encode({"jsonrpc": "2.0", "method": "exit"})))  # no shutdown first
    try:
        code = await asyncio.wait_for(server.proc.wait(), 15)
    except asyncio.TimeoutError:
        code = None
        server.proc.kill()
        await server.proc.wait()
    server.reader.cancel()
    unanswered = sum(server.answers[k] == 0 for k in expected)
    twice = sum(server.answers[k] > 1 for k in expected)
    checked = {u: m for u, m in stream.docs.items() if u != SCRATCH}
    differ = sorted(u for u, m in checked.items() if digests.get(u) != text_digest(m.text))
    return {
        "seed": seed, "messages": args.messages, "kinds": dict(kinds), "requests": len(expected),
        "unanswered": unanswered, "answered_twice": twice, "documents_checked": len(checked),
        "documents_differ": differ[:10], "documents_differ_count": len(differ),
        "completes_after": "result" in completion, "crashed": crashed, "exit_code": code,
        "exited_on_exit_without_shutdown": code is not None, "peak_rss_mb": peak,
        "messages_shown": server.messages_shown, "bad_frames_from_server": server.bad_frames,
        "send_s": round(sent_s, 1), "total_s": round(time.perf_counter() - started, 1),
    }


def stalled_client(args) -> dict:
    """A client that sends `--stalled-requests` completion requests and, for `--stall-s` seconds,
    does not read a byte of what the server writes (plain blocking pipes: nothing reads ahead for
    it), then reads again: the server's memory before and at the end of the stall, how many requests
    got through meanwhile (the server stops reading once its output waits), and whether every
    request then got exactly one answer."""
    import subprocess
    import threading

    log = open(f"{args.server_log}-stalled.log", "wb") if args.server_log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "memosight.server", "--stdio"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log,
                            env={**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")})
    uri, position = "file:///fuzz/stalled.py", {"line": 5, "character": 4}
    text = "def add(a, b):\n    return a + b\n\n\ndef main():\n    \n"

    def send(payload: dict) -> None:
        proc.stdin.write(frame(encode(payload)))
        proc.stdin.flush()

    def read_one() -> dict | None:
        length = None
        while (line := proc.stdout.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("ascii").partition(":")
            length = int(value) if name.lower() == "content-length" else length
        return json.loads(proc.stdout.read(length)) if length else None

    options = {"model": args.model} if args.model else {}
    send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "processId": os.getpid(), "rootUri": None, "capabilities": {}, "initializationOptions": options}})
    send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
        "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}})
    completion = {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": 1}}
    send({"jsonrpc": "2.0", "id": "ready", "method": "textDocument/inlineCompletion", "params": completion})
    while (message := read_one()) is not None and message.get("id") != "ready":  # the model is loaded
        pass
    rss_before = process_memory_mb(proc.pid)
    sent = [0]

    def send_all() -> None:
        try:
            for i in range(args.stalled_requests):
                send({"jsonrpc": "2.0", "id": i, "method": "textDocument/inlineCompletion", "params": completion})
                sent[0] += 1
        except (BrokenPipeError, ValueError):
            pass
    writer = threading.Thread(target=send_all, daemon=True)
    writer.start()
    time.sleep(args.stall_s)  # reading nothing
    sent_during_stall, rss_stalled = sent[0], process_memory_mb(proc.pid)
    answers: collections.Counter = collections.Counter()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while len(answers) < args.stalled_requests and time.monotonic() < deadline:  # reading again
        message = read_one()
        if message is None:
            break
        if "id" in message and "method" not in message:
            answers[message["id"]] += 1
    writer.join(10)
    peak = process_memory_mb(proc.pid, "VmHWM")
    with contextlib.suppress(BrokenPipeError, ValueError):
        send({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"})
        send({"jsonrpc": "2.0", "method": "exit"})
        proc.stdin.close()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    counts = [answers[i] for i in range(args.stalled_requests)]
    return {"requests": args.stalled_requests, "stall_s": args.stall_s, "sent_during_stall": sent_during_stall,
            "rss_before_mb": rss_before, "rss_after_stall_mb": rss_stalled, "peak_rss_mb": peak,
            "answered_once": sum(c == 1 for c in counts), "unanswered": sum(c == 0 for c in counts),
            "answered_twice": sum(c > 1 for c in counts)}


async def fuzz(args) -> dict:
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        run = await fuzz_one(seed, args)
        runs.append(run)
        say(f"seed {seed}: {run['requests']} requests, {run['unanswered']} unanswered, "
                      f"{run['documents_differ_count']} documents differ, peak {run['peak_rss_mb']} MB, "
                      f"{run['total_s']} s")
    ok = all(r["unanswered"] == 0 and r["answered_twice"] == 0 and not r["documents_differ_count"]
             and r["completes_after"] and not r["crashed"] and r["exited_on_exit_without_shutdown"]
             and not r["bad_frames_from_server"] for r in runs)
    stalled = None
    if args.stalled_requests:
        stalled = await asyncio.to_thread(stalled_client, args)
        say(f"stalled client: {stalled['answered_once']} of {stalled['requests']} answered once, RSS "
            f"{stalled['rss_before_mb']} -> {stalled['rss_after_stall_mb']} MB")
        ok = ok and stalled["answered_once"] == stalled["requests"]
    peaks = [r["peak_rss_mb"] for r in runs if r["peak_rss_mb"] is not None]
    return {"model": args.model or "embedded", "seeds": len(runs), "messages": sum(r["messages"] for r in runs),
            "requests": sum(r["requests"] for r in runs), "all_checks_passed": ok,
            "peak_rss_mb": max(peaks) if peaks else None, "runs": runs, "stalled_client": stalled}


def render(result: dict) -> str:
    lines = [f"{result['messages']} messages over {result['seeds']} seeds ({result['requests']} well-formed "
             f"requests), model {result['model']}: {'every check passed' if result['all_checks_passed'] else 'CHECKS FAILED'}; "
             f"peak RSS {result['peak_rss_mb']} MB"]
    for r in result["runs"]:
        lines.append(f"  seed {r['seed']}: unanswered {r['unanswered']}, answered twice {r['answered_twice']}, "
                     f"documents differ {r['documents_differ_count']} of {r['documents_checked']}, completes after: "
                     f"{r['completes_after']}, exit code {r['exit_code']}, peak {r['peak_rss_mb']} MB, {r['total_s']} s"
                     + (f", CRASHED: {r['crashed']}" if r["crashed"] else ""))
    st = result.get("stalled_client")
    if st:
        lines.append(f"  a client not reading for {st['stall_s']:g} s while sending {st['requests']} requests "
                     f"({st['sent_during_stall']} got through meanwhile): RSS {st['rss_before_mb']} MB before, "
                     f"{st['rss_after_stall_mb']} MB at the end of the stall; then "
                     f"{st['answered_once']} answered once, {st['unanswered']} unanswered, {st['answered_twice']} twice")
    return "\n".join(lines)


def run(args) -> int:
    if args.seeds < 0 or args.messages < 1 or args.stalled_requests < 0:
        raise CommandError("--seeds and --stalled-requests must be at least 0, --messages at least 1")
    result = asyncio.run(fuzz(args))
    print_result(result, args.json, render, cpu=True)
    return 0 if result["all_checks_passed"] else 1
