"""Long typing with faults injected, the run behind `memosight bench soak`: a server under test
(memosight.server.with_faults) and a reference without faults get the same edits; the first
completion after each fault is probed in both and must be equal (greedy decoding is deterministic).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from os.path import commonprefix  # of any two strings
from pathlib import Path

from ..commands.common import CommandError, process_memory_mb, step_progress
from .lsp_client import suggestion_text
from .replay import count_stale, keystrokes, pick_functions, position_of

# What the project file becomes, in turn: settings that change the context and the length, and
# files a user might save half-written or wrong. None of them changes the model.
CONFIG_VERSIONS = [
    "context_budget = 512\n",
    "max_new_tokens = 16\nsuffix_share = 0.1\n",
    "context_budget = [[[\n",  # a syntax error, as saved half-written
    "x = " + "[" * 3000 + "]" * 3000 + "\n",  # nested too deeply for a recursive reader
    'context_budget = "lots"\nmultiline = 7\n',  # wrong types
    "",
]


@dataclass
class Checks:
    """Completions compared with the reference server's at the same text."""

    checked: int = 0
    matched: int = 0
    mismatches: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"checked": self.checked, "matched": self.matched, "mismatches": self.mismatches[:5]}


@dataclass
class Soak:
    keystrokes: int = 0
    requests: int = 0
    with_items: int = 0
    cancelled_by_client: int = 0
    superseding: int = 0
    accepted: int = 0
    stale: int = 0
    crossed: int = 0
    config_rewrites: int = 0
    documents_opened: int = 0
    after_fault: Checks = field(default_factory=lambda: Checks())
    control: Checks = field(default_factory=lambda: Checks())  # the same check where no fault came before
    memory: list[dict] = field(default_factory=list)  # samples over the run
    probes: int = 0
    futures: list[asyncio.Future] = field(default_factory=list)


@dataclass
class Doc:
    uri: str
    text: str
    cursor: int
    remaining: str
    version: int = 1
    pending: tuple[int, asyncio.Future] | None = None


def rss_mb(pid: int) -> float | None:
    """The process's resident memory now (Linux), in MB."""
    return process_memory_mb(pid)


class Pair:
    """The server under test and the reference: every notification goes to both."""

    def __init__(self, test, reference):
        self.test, self.reference = test, reference

    def notify(self, method: str, params) -> None:
        self.test.notify(method, params)
        self.reference.notify(method, params)


async def soak(args) -> dict:
    from .lsp_client import LspProcess

    rng = random.Random(args.seed)
    functions = pick_functions(args.corpus, 10_000, 400, rng)
    if len(functions) < args.documents:
        raise CommandError(f"found {len(functions)} functions of at most 400 characters under {args.corpus}; "
                           f"--documents {args.documents} needs at least as many")
    scratch = Path(tempfile.mkdtemp(prefix="memosight-soak-"))
    # The workspace root holds the config file; the documents lie beside it, so that no closed
    # document enters the workspace index, whose picks depend on the requests' history: the
    # reference server, asked less often, would pick differently.
    workspace, documents = scratch / "workspace", scratch / "documents"
    workspace.mkdir()
    documents.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    base = [sys.executable, "-m", "memosight.server", "--stdio"]
    log_args = ["--log-file", args.server_log, "--log-level", "info"] if args.server_log else []
    test = LspProcess([sys.executable, "-m", "memosight.server.with_faults", "--faults", args.faults, "--stdio",
                       *log_args], env=env)
    reference = LspProcess(base, env=env)
    servers = Pair(test, reference)
    # No time budget on multi-line suggestions: where a suggestion ends must not depend on the load.
    # Prompts computed exactly: the two servers are compared token for token, and moved cells (the
    # default on llama.cpp: near a fresh prefill, not equal to it) would differ by design, not by a fault.
    options = {"latency_budget_ms": 0, "exact_prompt": True, **({"model": args.model} if args.model else {})}
    started = time.perf_counter()
    try:
        for lsp in (test, reference):
            await lsp.start()
            await lsp.call("initialize", {"processId": os.getpid(), "rootUri": workspace.as_uri(),
                                          "capabilities": {},
                                          "initializationOptions": options})
            lsp.notify("initialized", {})
        await warm_up(servers, workspace)
        rss_start = rss_mb(test.proc.pid)
        stats = Soak()
        await type_back(servers, workspace, documents, functions, args, rng, stats)
        # after warm-up: the first sample once a quarter of the keystrokes are typed
        rss_after_warm_up = next((m["rss_mb"] for m in stats.memory if m["keystrokes"] >= args.keystrokes // 4),
                                 None)
        answered, errors = await settle(stats)
        rss_end = rss_mb(test.proc.pid)
        status = await test.call("memosight/status", {})
        alive = await completes(test, workspace)
        exit_code = await stop(test)
    finally:
        with contextlib.suppress(Exception):
            await stop(reference)
        with contextlib.suppress(Exception):
            await stop(test)
        shutil.rmtree(scratch, ignore_errors=True)
    faults = status.get("faults", {})
    popups = sum(1 for method, _ in test.notifications if method == "window/showMessage")
    return {
        "model": status.get("model"), "device": status.get("device"), "cpu": status.get("cpu"),
        "fault_plan": args.faults,
        "duration_s": round(time.perf_counter() - started, 1),
        "keystrokes": stats.keystrokes, "documents_opened": stats.documents_opened,
        "requests": stats.requests, "answered": answered, "unanswered": stats.requests - answered,
        "answered_with_error": errors, "with_suggestion": stats.with_items,
        "cancelled_by_client": stats.cancelled_by_client, "superseding_requests": stats.superseding,
        "accepted": stats.accepted, "config_rewrites": stats.config_rewrites,
        "faults": {"raised": faults.get("raised", 0), "slowed": faults.get("slowed", 0),
                   "streams": faults.get("streams", 0)},
        "after_fault": stats.after_fault.to_json(), "control": stats.control.to_json(),
        "stale_suggestions": stats.stale, "crossed_cancellations": stats.crossed,
        "server_errors": status.get("requests", {}).get("errors"), "popups": popups,
        "rss_mb": {"start": rss_start, "after_warm_up": rss_after_warm_up, "end": rss_end,
                   "growth_after_warm_up": round(rss_end - rss_after_warm_up, 1)
                   if rss_end is not None and rss_after_warm_up is not None else None,
                   "samples": stats.memory},
        "peak_rss_mb": status.get("peak_rss_mb"),
        "completing_at_end": alive, "exit_code": exit_code,
    }


async def warm_up(servers: Pair, workspace: Path) -> None:
    """Load both engines (a first request waits for the model)."""
    uri = (workspace / "warm_up.py").as_uri()
    servers.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                             "text": "def f(x):\n    return x\n"}})
    for lsp in (servers.test, servers.reference):
        with contextlib.suppress(RuntimeError):  # a fault on the warm-up request is a fault like any other
            await lsp.call("textDocument/inlineCompletion", {"textDocument": {"uri": uri},
                                                             "position": {"line": 1, "character": 4},
                                                             "context": {"triggerKind": 1}}, timeout=300)
    servers.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def open_next(servers: Pair, folder: Path, functions: list, stats: Soak) -> Doc:
    path, text, start, end = functions[stats.documents_opened % len(functions)]
    stats.documents_opened += 1
    doc_text = text[:start] + text[end:]
    file = folder / f"doc{stats.documents_opened}_{path.name}"
    file.write_text(doc_text, encoding="utf-8")  # the file on disk holds what the editor shows
    doc = Doc(file.as_uri(), doc_text, start, text[start:end])
    servers.notify("textDocument/didOpen", {"textDocument": {"uri": doc.uri, "languageId": "python", "version": 1,
                                                             "text": doc_text}})
    return doc


async def type_back(servers: Pair, workspace: Path, documents: Path, functions: list, args,
                    rng: random.Random, stats: Soak) -> None:
    """Type until --keystrokes, sampling the server's memory every tenth of them."""
    test = servers.test
    docs = [open_next(servers, documents, functions, stats) for _ in range(args.documents)]
    current = 0
    faults_seen = 0
    next_config = args.config_every
    next_sample = max(1, args.keystrokes // 10)
    with step_progress("keystrokes", unit="key") as on_step:
        while stats.keystrokes < args.keystrokes:
            if rng.random() < args.switch:
                current = rng.randrange(len(docs))
            doc = docs[current]
            for key in keystrokes(doc.remaining)[:rng.randint(1, 6)]:
                cancel_pending(test, doc, stats)  # typing resumes: the editor cancels what it asked
                insert(servers, doc, key)
                stats.keystrokes += 1
                await asyncio.sleep(args.key_ms / 1000)
            if stats.keystrokes >= next_config:
                next_config += args.config_every
                rewrite_config(servers, workspace, stats)
            if stats.keystrokes >= next_sample:  # memory over the run: the process, and the engine's KV blocks
                next_sample += max(1, args.keystrokes // 10)
                tree = ((await test.call("memosight/status", {})).get("cache") or {}).get("prefix_tree") or {}
                stats.memory.append({"keystrokes": stats.keystrokes, "rss_mb": rss_mb(test.proc.pid),
                                     "kv_blocks_mb": round(tree.get("bytes", 0) / 2**20, 1)})
            on_step(min(stats.keystrokes, args.keystrokes), args.keystrokes, {"requests": stats.requests})
            if not doc.remaining:  # the function is typed: close it, open the next
                cancel_pending(test, doc, stats)
                servers.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
                docs[current] = open_next(servers, documents, functions, stats)
                continue
            result = await ask(test, doc, args, rng, stats)
            if result is None:
                continue
            faults = (await test.call("memosight/status", {})).get("faults", {})
            injected = faults.get("raised", 0) + faults.get("slowed", 0)
            if injected > faults_seen:  # a fault since the last check: is the next completion right?
                faults_seen = injected
                await probe(servers, doc, stats, stats.after_fault)
            elif rng.random() < args.control:
                await probe(servers, doc, stats, stats.control)
            match = len(commonprefix([suggestion_text(result), doc.remaining]))
            if match >= 3:  # the simulated user takes the suggestion's start where it is right
                insert(servers, doc, doc.remaining[:match])
                stats.accepted += 1
                await test.call("workspace/executeCommand", {"command": "memosight.accepted", "arguments": [match]})


def insert(servers: Pair, doc: Doc, piece: str) -> None:
    pos = position_of(doc.text, doc.cursor)
    doc.version += 1
    servers.notify("textDocument/didChange", {"textDocument": {"uri": doc.uri, "version": doc.version},
                                              "contentChanges": [{"range": {"start": pos, "end": pos}, "text": piece}]})
    doc.text = doc.text[:doc.cursor] + piece + doc.text[doc.cursor:]
    doc.cursor += len(piece)
    doc.remaining = doc.remaining[len(piece):]


def cancel_pending(test, doc: Doc, stats: Soak) -> None:
    if doc.pending is None:
        return
    msg_id, fut = doc.pending
    doc.pending = None
    if fut.done():
        return
    test.cancel(msg_id)
    stats.cancelled_by_client += 1
    sent = stats.requests
    fut.add_done_callback(lambda f: count_stale(f, stats, sent))


def completion_params(doc: Doc) -> dict:
    return {"textDocument": {"uri": doc.uri}, "position": position_of(doc.text, doc.cursor),
            "context": {"triggerKind": 2}}


async def ask(test, doc: Doc, args, rng: random.Random, stats: Soak):
    """A completion request at the cursor (sometimes twice at once); its result if it came in time."""
    params = completion_params(doc)
    if rng.random() < args.supersede:  # the first of two: superseded, it must still be answered
        _, first = test.request("textDocument/inlineCompletion", params)
        stats.futures.append(first)
        stats.requests += 1
        stats.superseding += 1
    msg_id, fut = test.request("textDocument/inlineCompletion", params)
    stats.futures.append(fut)
    stats.requests += 1
    doc.pending = (msg_id, fut)
    try:
        result = await asyncio.wait_for(asyncio.shield(fut), args.pause_ms / 1000)
    except asyncio.TimeoutError:
        return None  # still generating when typing resumes: the next keystroke cancels it
    except (RuntimeError, ConnectionError):
        doc.pending = None
        return None
    doc.pending = None
    if suggestion_text(result):
        stats.with_items += 1
    return result


async def probe(servers: Pair, doc: Doc, stats: Soak, checks: Checks) -> None:
    """Open the document's text anew in both servers and compare their completions at its cursor.
    A new document has no history in either server (no suggestion to type through, no earlier
    context choices), so the two must be equal unless the server under test kept something broken."""
    stats.probes += 1
    uri = doc.uri[:-len(".py")] + f".probe{stats.probes}.py"
    servers.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                             "text": doc.text}})
    params = {**completion_params(doc), "textDocument": {"uri": uri}}
    try:
        got = await clean_completion(servers.test, params)
        want = await clean_completion(servers.reference, params)
    finally:
        servers.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    if got is None or want is None:
        return
    checks.checked += 1
    if got == want:
        checks.matched += 1
    else:
        checks.mismatches.append({"document": doc.uri, "cursor": doc.cursor, "got": got, "expected": want})


async def clean_completion(lsp, params: dict, tries: int = 4) -> str | None:
    """The suggestion of a generation that no fault hit (a fault on this request: ask again)."""
    for _ in range(tries):
        before = ((await lsp.call("memosight/status", {})).get("faults") or {}).get("raised", 0)
        try:
            result = await lsp.call("textDocument/inlineCompletion", params, timeout=120)
        except RuntimeError:
            continue
        after = ((await lsp.call("memosight/status", {})).get("faults") or {}).get("raised", 0)
        if after == before:
            return suggestion_text(result)
    return None


def rewrite_config(servers: Pair, workspace: Path, stats: Soak) -> None:
    config = workspace / ".memosight.toml"
    config.write_text(CONFIG_VERSIONS[stats.config_rewrites % len(CONFIG_VERSIONS)], encoding="utf-8")
    stats.config_rewrites += 1
    servers.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": config.as_uri(), "type": 2}]})


async def settle(stats: Soak) -> tuple[int, int]:
    """Wait for the answers still out; (requests answered, of them with an error)."""
    pending = [f for f in stats.futures if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=60)
    done = [f for f in stats.futures if f.done()]
    return len(done), sum(1 for f in done if not f.cancelled() and f.exception() is not None)


async def completes(lsp, workspace: Path) -> bool:
    """After everything: a new document still gets a suggestion."""
    uri = (workspace / "final.py").as_uri()
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    "}})
    for _ in range(5):  # a fault may hit this request too; the next one must work
        with contextlib.suppress(RuntimeError):
            result = await lsp.call("textDocument/inlineCompletion", {
                "textDocument": {"uri": uri}, "position": {"line": 5, "character": 4},
                "context": {"triggerKind": 1}}, timeout=120)
            if suggestion_text(result):
                return True
    return False


async def stop(lsp) -> int | None:
    await lsp.stop()
    return lsp.proc.returncode if lsp.proc else None
