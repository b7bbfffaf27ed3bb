"""The fuzz run behind `memosight bench fuzz`: a hostile client, at scale, against a real `memosight-lsp
--stdio`, phase by phase; its answers are checked as they come (fuzz_checks.py). A run is told its
options as the command parsed them (seeds, messages, heavy documents, the stalled client).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import sys
import time

from ..commands.common import process_memory_mb, say
from ..documents import text_digest
from .fuzz_checks import AnswerTally, MemoryWatch, latency_summary, left_cleanly
from .fuzz_stream import NON_ASCII_URI, SCRATCH, Asked, FuzzStream, Message, encode, frame
from .lsp_client import read_frame

ANSWER_TIMEOUT_S = 180.0  # for the last answers after the stream, a cold model included
EXIT_TIMEOUT_S = 15.0  # for a server to leave once its client is gone
STATUS = "memosight/status"
MEMORY_POLL_EVERY = 200  # messages between two memory reports asked during the stream
POLL_ID = "check-memory-"  # their ids; nothing waits for their answers
NON_ASCII_STEPS = 40
BURST_ROUNDS, BURST_PAUSE_S = 24, 0.3  # the burst before leaving: twice this many requests, a pause between


# --- the server --------------------------------------------------------------------------------------


def server_command() -> list[str]:
    return [sys.executable, "-m", "memosight.server", "--stdio"]


def server_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}


class RawServer:
    """memosight-lsp over pipes, written to in raw bytes; every frame it sends is read and counted,
    and the answers to completion requests checked as they come."""

    def __init__(self, command: list[str]):
        self.command = command
        self.answers: collections.Counter = collections.Counter()  # json.dumps(id) -> answers
        self.expected: list[str] = []  # the well-formed requests sent, json.dumps(id)
        self.kinds: collections.Counter = collections.Counter()  # the messages sent, by kind
        self.asked: dict[str, Asked] = {}  # completion requests not answered yet, by json.dumps(id)
        self.tally = AnswerTally()
        self.memory = MemoryWatch()
        self.polls = 0
        self.results: dict[str, dict] = {}  # the answers to the harness's own checks, by id
        self.messages_shown = 0
        self.bad_frames = 0  # frames from the server that are not strict JSON-RPC
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, log_path: str | None) -> None:
        stderr = open(log_path, "wb") if log_path else asyncio.subprocess.DEVNULL
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env=server_env(), limit=2**26)
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
                self._answered(message)

    def _answered(self, message: dict) -> None:
        key = json.dumps(message["id"])
        self.answers[key] += 1
        asked = self.asked.pop(key, None)
        if asked is not None:
            self.tally.add(asked, message, time.perf_counter())
        msg_id = message["id"]
        if isinstance(msg_id, str) and msg_id.startswith("check-"):
            result = message.get("result")
            if isinstance(result, dict) and "requests" in result:  # a status answer: counters, memory report
                self.memory.add(result)
            if not msg_id.startswith(POLL_ID):
                self.results[msg_id] = message

    async def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def send(self, message: Message) -> Message:
        """A message of the stream: its requests are expected to be answered, each once; a completion
        request's answer is checked against what the request saw."""
        self.kinds[message.kind] += 1
        self.expected.extend(json.dumps(i) for i in message.request_ids)
        if message.asked is not None:
            message.asked.sent_at = time.perf_counter()
            self.asked[json.dumps(message.request_ids[0])] = message.asked
        await self.write(message.data)
        return message

    async def answer_to(self, message: Message) -> None:
        """Wait until each request of `message` is answered."""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while any(self.answers[json.dumps(i)] == 0 for i in message.request_ids):
            if time.monotonic() > deadline or self.reader.done():
                raise TimeoutError("no answer to a completion request")
            await asyncio.sleep(0.01)

    async def poll_memory(self) -> None:
        """A memosight/status that nothing waits for: its memory report is read as it comes."""
        self.polls += 1
        await self.write(frame(encode({"jsonrpc": "2.0", "id": f"{POLL_ID}{self.polls}", "method": STATUS,
                                       "params": {}})))

    async def check(self, name: str, method: str, params) -> dict:
        msg_id = f"check-{name}"
        await self.write(frame(encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})))
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while msg_id not in self.results:
            if time.monotonic() > deadline or self.reader.done():
                raise TimeoutError(f"no answer to {method}")
            await asyncio.sleep(0.02)
        return self.results[msg_id]

    def unanswered(self) -> int:
        return sum(self.answers[k] == 0 for k in self.expected)

    def answered_twice(self) -> int:
        return sum(self.answers[k] > 1 for k in self.expected)

    async def wait_exit(self) -> int | None:
        """Its exit code (below 0: the signal that ended it); None if it did not leave within
        EXIT_TIMEOUT_S (then it is killed)."""
        try:
            code = await asyncio.wait_for(self.proc.wait(), EXIT_TIMEOUT_S)
        except TimeoutError:
            code = None
            self.proc.kill()
            await self.proc.wait()
        self.reader.cancel()
        return code


async def initialize(server: RawServer, args) -> None:
    options = {"model": args.model} if args.model else {}
    await server.write(frame(encode({"jsonrpc": "2.0", "id": "check-init", "method": "initialize", "params": {
        "processId": os.getpid(), "rootUri": None, "capabilities": {}, "initializationOptions": options}})))
    await server.write(frame(encode({"jsonrpc": "2.0", "method": "initialized", "params": {}})))


def log_path(args, name) -> str | None:
    return f"{args.server_log}-{name}.log" if args.server_log else None


# --- a seed's run, phase by phase ---------------------------------------------------------------------


async def send_stream(server: RawServer, stream: FuzzStream, messages: int) -> None:
    """The stream, made as it is sent (its heavy documents are not all held at once), with a memory
    report asked every MEMORY_POLL_EVERY messages."""
    for i, message in enumerate(itertools.chain(stream.opening(), (stream.next() for _ in range(messages)))):
        await server.send(message)
        if i % MEMORY_POLL_EVERY == 0:
            await server.poll_memory()


async def wait_for_answers(server: RawServer) -> None:
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while server.unanswered() and time.monotonic() < deadline and not server.reader.done():
        await asyncio.sleep(0.05)


async def non_ascii_phase(server: RawServer, stream: FuzzStream) -> int:
    """NON_ASCII_STEPS edits around characters outside ASCII, the server's digest of the document
    asked after each: the steps after which it differed from the client's copy."""
    await server.send(stream.non_ascii_document())
    differ = 0
    for step in range(NON_ASCII_STEPS):
        again = step % 2 == 0  # a completion answered first: the same request behind the edit hits the cache
        if again:
            await server.answer_to(await server.send(stream.non_ascii_ask()))
        await server.send(stream.non_ascii_step(again))
        digests = (await server.check(f"non-ascii-{step}", STATUS, {"digests": True}))["result"]["digests"]
        differ += digests.get(NON_ASCII_URI) != text_digest(stream.docs[NON_ASCII_URI].text)
    return differ


async def completes_in_a_new_document(server: RawServer, name: str) -> bool:
    uri = f"file:///fuzz/{name}.py"
    await server.write(frame(encode({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
        "textDocument": {"uri": uri, "languageId": "python", "version": 1,
                         "text": "def add(a, b):\n    return a + b\n\n\ndef main():\n    \n"}}})))
    completion = await server.check(name, "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 5, "character": 4}, "context": {"triggerKind": 1}})
    return "result" in completion


async def close_with_work_in_flight(server: RawServer, stream: FuzzStream) -> int | None:
    """The end of a seed's run: a burst of completion requests and edits, a pause for generations to
    start and answers to go out (prefetches follow them), a second burst, then stdin closed with no
    shutdown or exit. A server that once left this way died of SIGABRT. Its exit code."""
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        for message in stream.burst(BURST_ROUNDS):
            await server.send(message)
        await asyncio.sleep(BURST_PAUSE_S)
        for message in stream.burst(BURST_ROUNDS):
            await server.send(message)
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        server.proc.stdin.close()
    return await server.wait_exit()


async def exit_with_work_in_flight(args, seed: int) -> int | None:
    """A second server for the seed: a few documents and a burst of completion requests and edits
    while its model loads, then `exit` without `shutdown`. Its exit code (1: no shutdown came first)."""
    server = RawServer(server_command())
    await server.start(log_path(args, f"{seed}-exit"))
    stream = FuzzStream(seed, heavy=False)
    await initialize(server, args)
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        for message in stream.opening() + stream.burst(BURST_ROUNDS):
            await server.send(message)
        await server.write(frame(encode({"jsonrpc": "2.0", "method": "exit"})))
    return await server.wait_exit()


async def fuzz_one(seed: int, args) -> tuple[dict, list[float]]:
    """A seed's run: its figures, and the latencies of its completion requests (ms)."""
    server = RawServer(server_command())
    await server.start(log_path(args, seed))
    stream = FuzzStream(seed, args.huge_mb, heavy=args.heavy)
    started = time.perf_counter()
    await initialize(server, args)
    crashed, digests, completes, non_ascii_differ, sent_s = None, {}, False, None, None
    try:
        # the model loaded first: the latencies are the stream's, and its requests run generations
        await completes_in_a_new_document(server, "ready")
        stream_started = time.perf_counter()
        await send_stream(server, stream, args.messages)
        sent_s = time.perf_counter() - stream_started
        await wait_for_answers(server)
        non_ascii_differ = await non_ascii_phase(server, stream)
        await server.send(stream.accepted_flood())  # now that completions were answered: the bound is theirs
        await wait_for_answers(server)
        digests = (await server.check("digests", STATUS, {"digests": True}))["result"]["digests"]
        completes = await completes_in_a_new_document(server, "final")
    except (ConnectionError, TimeoutError, BrokenPipeError) as exc:
        crashed = str(exc)
    except (KeyError, TypeError) as exc:  # a status answered with an error, or of another shape
        crashed = f"an unexpected answer: {exc!r}"
    sent_s = sent_s if sent_s is not None else time.perf_counter() - started  # it crashed: up to then
    peak = process_memory_mb(server.proc.pid, "VmHWM")
    # taken before the burst, which edits the client's copies and whose answers nobody waits for
    unanswered, twice = server.unanswered(), server.answered_twice()
    checked = {u: m for u, m in stream.docs.items() if u != SCRATCH}
    differ = sorted(u for u, m in checked.items() if digests.get(u) != text_digest(m.text))
    closed_stdin_code = await close_with_work_in_flight(server, stream)
    exit_code = await exit_with_work_in_flight(args, seed)
    run = {
        "seed": seed, "messages": args.messages, "kinds": dict(server.kinds), "requests": len(server.expected),
        "unanswered": unanswered, "answered_twice": twice, "documents_checked": len(checked),
        "documents_differ": differ[:10], "documents_differ_count": len(differ),
        "non_ascii_steps": NON_ASCII_STEPS, "non_ascii_steps_differ": non_ascii_differ,
        "completions": server.tally.to_json(),
        "acceptances": {**server.memory.counters, "bounded": server.memory.bounded()},
        "completes_after": completes, "crashed": crashed,
        "closed_stdin_exit_code": closed_stdin_code, "left_on_closed_stdin": left_cleanly(closed_stdin_code),
        "exit_code": exit_code, "exited_on_exit_without_shutdown": left_cleanly(exit_code),
        "peak_rss_mb": peak, "memory_reports": server.memory.reports, "memory_at_peak": server.memory.at_peak,
        "messages_shown": server.messages_shown, "bad_frames_from_server": server.bad_frames,
        "send_s": round(sent_s, 1), "total_s": round(time.perf_counter() - started, 1),
    }
    return run, server.tally.latencies_ms


def run_passed(r: dict) -> bool:
    answers = r["completions"]
    return (r["unanswered"] == 0 and r["answered_twice"] == 0 and not r["documents_differ_count"]
            and r["non_ascii_steps_differ"] == 0 and answers["not_open"] == 0
            and answers["built_on_another_version"] == 0 and r["acceptances"]["bounded"]
            and r["completes_after"] and not r["crashed"] and r["left_on_closed_stdin"]
            and r["exited_on_exit_without_shutdown"] and not r["bad_frames_from_server"])


def stalled_client(args) -> dict:
    """A client that sends `--stalled-requests` completion requests and, for `--stall-s` seconds,
    does not read a byte of what the server writes (plain blocking pipes: nothing reads ahead for
    it), then reads again: the server's memory before and at the end of the stall, how many requests
    got through meanwhile (the server stops reading once its output waits), and whether every
    request then got exactly one answer."""
    import subprocess
    import threading

    log = open(f"{args.server_log}-stalled.log", "wb") if args.server_log else subprocess.DEVNULL
    proc = subprocess.Popen(server_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            env=server_env())
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
    runs, latencies = [], []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        run, run_latencies = await fuzz_one(seed, args)
        runs.append(run)
        latencies += run_latencies
        lat = run["completions"]["latency_ms"]
        say(f"seed {seed}: {run['requests']} requests, {run['unanswered']} unanswered, "
            f"{run['documents_differ_count']} documents differ, completion p50 {lat['p50']} ms, "
            f"peak {run['peak_rss_mb']} MB, {run['total_s']} s: {'passed' if run_passed(run) else 'FAILED'}")
    ok = all(run_passed(r) for r in runs)
    stalled = None
    if args.stalled_requests:
        stalled = await asyncio.to_thread(stalled_client, args)
        say(f"stalled client: {stalled['answered_once']} of {stalled['requests']} answered once, RSS "
            f"{stalled['rss_before_mb']} -> {stalled['rss_after_stall_mb']} MB")
        ok = ok and stalled["answered_once"] == stalled["requests"]
    peaks = [r["peak_rss_mb"] for r in runs if r["peak_rss_mb"] is not None]
    return {"model": args.model or "embedded", "heavy": args.heavy, "seeds": len(runs),
            "messages": sum(r["messages"] for r in runs), "requests": sum(r["requests"] for r in runs),
            "all_checks_passed": ok, "peak_rss_mb": max(peaks) if peaks else None,
            "completion_latency_ms": latency_summary(latencies), "runs": runs, "stalled_client": stalled}
