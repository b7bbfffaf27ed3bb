"""A typist on the real clock, the run behind `memosight bench typing`: the same keys into each
completion system in turn (typing_system.py), counting only a suggestion on screen when a key is
due, and taken with one Tab when what is left to type starts with it (or with its first line).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..commands.common import CommandError, say
from .replay import keystrokes, pick_functions

SYSTEMS = ("memosight", "memosight-llamacpp", "llamavim")


class LlamaServerLike(Protocol):
    """A llama-server process the llama-server systems talk to."""

    url: str
    process: subprocess.Popen

    def close(self) -> None: ...


@dataclass
class Typed:
    """What the typist saw of one system."""

    chars: int = 0  # characters of the functions
    keys: int = 0  # keys pressed: typed characters/newlines and Tabs
    due: int = 0  # moments a key was due
    visible: int = 0  # ... with a suggestion on screen
    saved: int = 0  # characters inserted by Tab
    acceptances: list[int] = field(default_factory=list)  # length of each taken suggestion
    seconds: float = 0.0


def taken(shown: str, remaining: str) -> str:
    """What one Tab inserts: the whole suggestion when it is what comes next, else its first line
    when that is; nothing otherwise."""
    if shown and remaining.startswith(shown):
        return shown
    first = shown.split("\n", 1)[0]
    return first if first and remaining.startswith(first) else ""


async def type_function(system, path: Path, text: str, start: int, end: int, args, typed: Typed) -> None:
    body, doc, cursor = text[start:end], text[:start] + text[end:], start
    await system.open(str(path), doc, cursor)
    remaining = body
    typed.chars += len(body)
    due = time.perf_counter() + args.read_ms / 1000
    while remaining:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        shown = system.visible()
        typed.due += 1
        typed.visible += bool(shown)
        piece = taken(shown, remaining)
        accepted = bool(piece)
        if accepted:
            typed.saved += len(piece)
            typed.acceptances.append(len(piece))
        else:
            piece = keystrokes(remaining[:200])[0]
        doc, cursor, remaining = doc[:cursor] + piece + doc[cursor:], cursor + len(piece), remaining[len(piece):]
        typed.keys += 1
        await system.edit(doc, cursor, piece, accepted)
        gap = args.newline_ms if piece.startswith("\n") and not accepted else args.key_ms
        due = time.perf_counter() + gap / 1000
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    await system.close(str(path))


def make_system(name: str, args, server):
    options = {"model": args.model} if args.model else {}
    options.update(dict(args.set))
    log = f"{args.server_log}-{name}.log" if args.server_log else None
    if name == "memosight":
        from .typing_lsp import LspSystem

        return LspSystem(name, options, log_file=log)
    if name == "memosight-llamacpp":
        from .typing_lsp import LspSystem

        # No fallback, so every figure is llama-server's; its timeouts as a user of a CPU server sets
        # them (the defaults, 2 s to the first token, are for a team's GPU server: a cold prompt of
        # Qwen2.5-Coder-0.5B on 2 cores takes longer, and llama.vim waits for it too).
        options["backend"] = {"kind": "llamacpp", "url": server.url, "fallback": "none",
                              "first_token_timeout_ms": 30000, "timeout_ms": 60000}
        if args.model:  # its tokenizer counts the budget and renders the FIM prompt
            options["backend"]["tokenizer"] = args.model
        return LspSystem(name, options, model_pid=server.process.pid, log_file=log)
    from .typing_llamavim import LlamaVimSystem

    return LlamaVimSystem(server.url, server_pid=server.process.pid)


async def run_system(name: str, functions, args, llama_server: Callable[[], LlamaServerLike]) -> dict:
    server = llama_server() if name != "memosight" else None
    try:
        system = make_system(name, args, server)
        await system.start()
        typed = Typed()
        started = time.perf_counter()
        for n, (path, text, start, end) in enumerate(functions):
            await type_function(system, path, text, start, end, args, typed)
            say(f"{name}: function {n + 1}/{len(functions)}, {typed.saved} characters saved so far")
        typed.seconds = time.perf_counter() - started
        stats = await system.stop()
    finally:
        if server is not None:
            server.close()
    return summarize(name, typed, stats)


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))], 1) if values else None


def summarize(name: str, typed: Typed, stats) -> dict:
    return {
        "system": name, "chars": typed.chars, "keys": typed.keys, "key_due": typed.due,
        "visible_in_time": typed.visible, "chars_saved": typed.saved,
        "chars_saved_share": round(typed.saved / typed.chars, 4) if typed.chars else 0.0,
        "acceptances": len(typed.acceptances),
        "mean_acceptance_chars": round(sum(typed.acceptances) / len(typed.acceptances), 1) if typed.acceptances else 0,
        "latency_ms": {"p50": percentile(stats.latencies_ms, 0.5), "p95": percentile(stats.latencies_ms, 0.95),
                       "shown": len(stats.latencies_ms)},
        "requests": stats.requests, "model_cpu_s": round(stats.model_cpu_s, 2),
        "model_cpu_s_per_saved_char": round(stats.model_cpu_s / typed.saved, 3) if typed.saved else None,
        "typing_s": round(typed.seconds, 1), "notes": stats.notes,
    }


async def bench(args, names: list[str], llama_server: Callable[[], LlamaServerLike]) -> dict:
    """Types the same functions into each system of `names` in turn; `llama_server()` starts a fresh
    llama-server for a system that needs one (the command's: the engine's bench runs it)."""
    functions = pick_functions(args.corpus, args.functions, args.max_chars, random.Random(args.seed))
    if not functions:
        raise CommandError(f"no function of at most {args.max_chars} characters under {args.corpus}")
    results = [await run_system(name, functions, args, llama_server) for name in names]
    base = next((r for r in results if r["system"] == "llamavim"), None)
    for r in results:
        r["vs_llamavim"] = (round(r["chars_saved"] / base["chars_saved"], 2) if base and base["chars_saved"]
                            else None)
    return {"clock": "real", "key_ms": args.key_ms, "newline_ms": args.newline_ms, "read_ms": args.read_ms,
            "seed": args.seed,
            "model": args.model or "embedded", "gguf": args.gguf, "settings": dict(args.set),
            "functions": [f"{p.name}:{t.count(chr(10), 0, s) + 1}" for p, t, s, _ in functions],
            "systems": results}
