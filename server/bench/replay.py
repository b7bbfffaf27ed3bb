"""Real files typed back into a real `memosight-lsp --stdio`, the run behind `memosight bench replay`.

A function is cut out of a file (`pick_functions`) and typed back keystroke by keystroke in bursts
(`replay_function`); after each burst an inline completion is asked, and a suggestion whose start
matches what comes next is taken. `summarize` turns a run and the server's status into the figures.
"""

from __future__ import annotations

import ast
import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field
from os.path import commonprefix  # of any two strings
from pathlib import Path

from ..commands.common import CommandError, step_progress
from .lsp_client import suggestion_text
from .replay_breakdown import breakdown, plot_breakdowns, prefill_per_keystroke


@dataclass
class Replay:
    pause_ms: float = 400.0
    latencies_ms: list[float] = field(default_factory=list)
    answered_ids: dict = field(default_factory=dict)  # request id -> latency measured here (ms)
    requests: int = 0
    answered: int = 0
    with_items: int = 0
    cancelled_by_client: int = 0
    stale: int = 0  # suggestions that arrived after a newer request for the document had been sent
    crossed: int = 0  # suggestions for a cancelled request that arrived before any newer request
    typed_chars: int = 0
    saved_chars: int = 0
    shown_chars: int = 0  # characters of the suggestions answered (what the user read)
    accepted: int = 0


def pick_functions(folder: str, count: int, max_chars: int, rng: random.Random,
                   min_lines: int = 0) -> list[tuple[Path, str, int, int]]:
    """(file, text, start, end): function spans whose text is short enough to type back."""
    root = Path(folder)
    if not root.is_dir():
        raise CommandError(f"corpus folder {folder!r} does not exist")
    found = []
    files = sorted(root.rglob("*.py"))
    rng.shuffle(files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.count("\n") < min_lines:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))
        spans = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        rng.shuffle(spans)
        for node in spans:
            start, end = offsets[node.lineno - 1], offsets[node.end_lineno]
            body = text[start:end]
            if 3 <= node.end_lineno - node.lineno <= 30 and len(body) <= max_chars:
                found.append((path, text, start, end))
                break
        if len(found) >= count:
            break
    return found


def keystrokes(text: str) -> list[str]:
    """What one keystroke inserts: a character, or a newline with the next line's indentation
    (editors indent automatically)."""
    keys, i = [], 0
    while i < len(text):
        if text[i] == "\n":
            j = i + 1
            while j < len(text) and text[j] == " ":
                j += 1
            keys.append(text[i:j])
            i = j
        else:
            keys.append(text[i])
            i += 1
    return keys


def bursts(keys: list[str], rng: random.Random, sizes: tuple[int, int] = (2, 9)) -> list[list[str]]:
    out, i = [], 0
    while i < len(keys):
        n = rng.randint(*sizes)
        out.append(keys[i:i + n])
        i += n
    return out


def position_of(text: str, offset: int) -> dict:
    line = text.count("\n", 0, offset)
    col_text = text[text.rfind("\n", 0, offset) + 1:offset]
    return {"line": line, "character": len(col_text.encode("utf-16-le")) // 2}


async def replay_function(lsp, uri: str, text: str, start: int, end: int, args, rng, stats: Replay) -> None:
    pause = stats.pause_ms / 1000 or None  # 0: wait for every answer
    body = text[start:end]
    doc = text[:start] + text[end:]
    version = 1
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": doc}})
    cursor = start
    remaining = body
    pending: tuple[int, asyncio.Future, float] | None = None

    def insert(piece: str) -> None:
        nonlocal doc, cursor, version, remaining
        pos = position_of(doc, cursor)
        version += 1
        lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                              "contentChanges": [{"range": {"start": pos, "end": pos},
                                                                  "text": piece}]})
        doc = doc[:cursor] + piece + doc[cursor:]
        cursor += len(piece)
        remaining = remaining[len(piece):]

    while remaining:
        burst = bursts(keystrokes(remaining), rng, args.burst)[0]
        for key in burst:
            if pending is not None and not pending[1].done():  # typing resumes: the editor cancels
                lsp.cancel(pending[0])
                stats.cancelled_by_client += 1
                sent = stats.requests
                pending[1].add_done_callback(lambda f, sent=sent: count_stale(f, stats, sent))
                pending = None
            insert(key)
            stats.typed_chars += len(key)
            await asyncio.sleep(args.key_ms / 1000)
        if not remaining:
            break
        sent = time.perf_counter()  # before the write: the server may read it before this line runs again
        msg_id, fut = lsp.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": position_of(doc, cursor), "context": {"triggerKind": 2}})
        stats.requests += 1
        pending = (msg_id, fut, sent)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), pause)
        except asyncio.TimeoutError:
            continue  # still generating when typing resumes
        except RuntimeError:
            pending = None
            continue
        pending = None
        stats.answered += 1
        # until the answer was read off the pipe, not until this coroutine got round to it
        stats.latencies_ms.append((lsp.answered_at.pop(msg_id, time.perf_counter()) - sent) * 1000)
        stats.answered_ids[msg_id] = stats.latencies_ms[-1]
        suggestion = suggestion_text(result)
        if not suggestion:
            continue
        stats.with_items += 1
        stats.shown_chars += len(suggestion)
        match = len(commonprefix([suggestion, remaining]))
        if match >= args.min_accept:
            insert(remaining[:match])
            stats.saved_chars += match
            stats.accepted += 1
            await lsp.call("workspace/executeCommand", {"command": "memosight.accepted", "arguments": [match]})
    if pending is not None:
        try:
            await asyncio.wait_for(pending[1], 30)
        except Exception:
            pass
    lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def count_stale(fut: asyncio.Future, stats, requests_when_cancelled: int) -> None:
    """A cancelled request's answer is stale only if a newer request went out before it arrived;
    one that crossed the cancellation on the wire arrives first and the editor drops it."""
    if fut.cancelled() or fut.exception() is not None:
        return
    result = fut.result()
    if suggestion_text(result):
        if stats.requests > requests_when_cancelled:
            stats.stale += 1
        else:
            stats.crossed += 1


async def replay(args) -> dict:
    from .lsp_client import LspProcess

    rng = random.Random(args.seed)
    functions = pick_functions(args.corpus, args.functions, args.max_chars, rng, args.min_lines)
    if not functions:
        raise CommandError(f"no function of at most {args.max_chars} characters in a file of at least "
                           f"{args.min_lines} lines under {args.corpus}")
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    server_args = ["--log-file", args.server_log, "--log-level", "debug"] if args.server_log else []
    lsp = LspProcess([sys.executable, "-m", "memosight.server", "--stdio", *server_args], env=env)
    spawned = time.perf_counter()
    await lsp.start()
    options = {"model": args.model} if args.model else {}
    if args.backend:
        kind, _, url = args.backend.partition("=")
        options["backend"] = {"kind": kind, "url": url, "fallback": "none"}
        if args.model:  # the model the server runs: its tokenizer counts the budget and renders FIM
            options["backend"]["tokenizer"] = args.model
    options.update(dict(args.set))
    root = Path(args.corpus).resolve().as_uri() if args.workspace == "corpus" else None
    await lsp.call("initialize", {"processId": os.getpid(), "rootUri": root, "capabilities": {},
                                  "initializationOptions": options})
    lsp.notify("initialized", {})
    warm_uri = Path(functions[0][0]).resolve().as_uri() + "#warmup"
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": warm_uri, "languageId": "python", "version": 1,
                                                         "text": "def f(x):\n    return x\n"}})
    first = await lsp.call("textDocument/inlineCompletion", {"textDocument": {"uri": warm_uri},
                                                             "position": {"line": 1, "character": 4},
                                                             "context": {"triggerKind": 1}}, timeout=300)
    # what a user waits for after the editor starts the server: spawn, load, the first answer
    first_answer = {"ms": round((time.perf_counter() - spawned) * 1000, 1), "text": suggestion_text(first)}
    results = []
    for pause in args.pauses:
        before = await lsp.call("memosight/status", {})
        stats = Replay(pause_ms=pause)
        typing = random.Random(args.seed)  # each mode types the same bursts
        with step_progress(f"functions (pause {pause:g} ms)", unit="function") as on_step:
            for n, (path, text, start, end) in enumerate(functions):
                await replay_function(lsp, path.resolve().as_uri(), text, start, end, args, typing, stats)
                on_step(n + 1, len(functions), {"requests": stats.requests})
        status = await lsp.call("memosight/status", {"recent": True})
        result = summarize(stats, before, status, len(functions))
        result["prefilled_per_keystroke"] = prefill_per_keystroke(
            stats.answered_ids, status.get("breakdown", {}).get("recent", []))
        result["first_answer"] = first_answer
        if args.breakdown:
            result["breakdown"] = breakdown(stats.answered_ids, status.get("breakdown", {}).get("recent", []))
        results.append(result)
    await lsp.stop()
    if args.plot:
        plot_breakdowns(results, args.plot)
    # the server's engine names the CPU it ran on (threads included)
    return results[0] if len(results) == 1 else {"modes": results, "cpu": results[0].get("cpu")}


def summarize(stats: Replay, before: dict, after: dict, functions: int) -> dict:
    lat = sorted(stats.latencies_ms)
    pick = (lambda q: round(lat[min(len(lat) - 1, int(len(lat) * q))], 1)) if lat else (lambda q: None)
    r0, r1 = before["requests"], after["requests"]
    delta = {k: r1[k] - r0.get(k, 0) for k in ("completed", "typed_through", "joined", "cancelled", "superseded")}
    c0, c1 = before.get("cache", {}), after.get("cache", {})
    prompt = c1.get("prompt_tokens", 0) - c0.get("prompt_tokens", 0)
    reused = c1.get("reused_tokens", 0) - c0.get("reused_tokens", 0)
    return {
        "model": after.get("model"), "device": after.get("device"), "dtype": after.get("dtype"),
        "runtime": after.get("runtime"), "runtime_why": (after.get("runtime_choice") or {}).get("why"),
        "cpu": after.get("cpu"), "functions": functions, "pause_ms": stats.pause_ms,
        "requests": stats.requests, "answered": stats.answered, "with_suggestion": stats.with_items,
        "latency_ms": {"p50": pick(0.5), "p95": pick(0.95), "max": round(lat[-1], 1) if lat else None},
        "typed_through_share": round(delta["typed_through"] / stats.answered, 4) if stats.answered else 0.0,
        "joined": delta["joined"],
        "kv_cache_share": round(reused / prompt, 4) if prompt else 0.0,
        "chars_typed": stats.typed_chars, "chars_saved": stats.saved_chars,
        "chars_saved_share": round(stats.saved_chars / (stats.saved_chars + stats.typed_chars), 4)
        if stats.typed_chars else 0.0,
        "accepted": stats.accepted,
        "chars_shown": stats.shown_chars,
        # of what was shown, the share the user took: a suggestion cut where the model is unsure
        # shows fewer wrong characters
        "chars_saved_of_shown": round(stats.saved_chars / stats.shown_chars, 4) if stats.shown_chars else 0.0,
        "cancelled_by_client": stats.cancelled_by_client, "server_cancelled": delta["cancelled"],
        "server_superseded": delta["superseded"], "stale_suggestions": stats.stale,
        "crossed_cancellations": stats.crossed,
        "server_peak_rss_mb": after.get("peak_rss_mb"),
        "backend": after.get("backend"),  # a remote engine's: state, latency, cancellations, cache shares
        "speculative": after.get("speculative"),  # the in-process engine's: steps, sources, ms a token
    }
