"""`memosight bench typing --corpus DIR --gguf FILE`: a typist on held-out code, the same keys into
several completion systems side by side, counting only what a user could have taken.

K functions (seeded) are cut out of real files and typed back one key at a time on the real clock:
a character, or a newline with the next line's indentation (editors indent), `--key-ms` apart and
`--newline-ms` after a newline. When a key is due, the typist looks at the screen first: a
suggestion counts only if it is visible then. The user takes it with one key (Tab) when the text
still to type starts with it, or else with its first line; that inserts the taken text.

Systems (`--systems`):
- `memosight`: memosight-lsp with its in-process engine (`--model`, default the embedded model),
  asked as the Neovim client asks (bench typing's typing_lsp.py).
- `memosight-llamacpp`: the same server and client with `[backend] kind = "llamacpp"` on a native
  llama-server serving `--gguf`: this project's context and client logic on llama.cpp's decoding.
- `llamavim`: llama.vim's request logic (ring of chunks, cache with look-back, prefetch after a
  hint, one request at a time; typing_llamavim.py) on its own native llama-server serving `--gguf`.

Each llama-server is the one `engine/bench/build_llama_cpp.sh` builds natively for this CPU, started
fresh per system with llama.vim's recommended server flags (`--cache-reuse 256`, `-ub 1024 -b 1024`,
default threads; `--llama-spec ngram-mod` adds the server's own speculation, `--spec-type`). Per system: keys pressed, suggestions visible when a key was due, characters saved
(share of all characters of the functions), acceptances and their mean length, latency from the edit
to the suggestion on screen (p50/p95), requests, and the model's CPU seconds per saved character.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from .bench_replay import keystrokes, pick_functions, setting
from .common import CommandError, add_json_argument, print_result, say

SYSTEMS = ("memosight", "memosight-llamacpp", "llamavim")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of Python source files (held-out code)")
    parser.add_argument("--gguf", help="the model as a GGUF file, for the llama-server systems (memosight export "
                                       "gguf writes the embedded one)")
    parser.add_argument("--model", help="memosight's model (default: the embedded model; give the same model as "
                                        "--gguf for a fair comparison)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {', '.join(SYSTEMS)} (default: all)")
    parser.add_argument("--functions", type=int, default=3, help="functions to type back")
    parser.add_argument("--max-chars", type=int, default=400, help="skip functions longer than this")
    parser.add_argument("--key-ms", type=float, default=120.0, help="time between keys (default 120)")
    parser.add_argument("--read-ms", type=float, default=0.0,
                        help="time between opening a function's file and its first key, the user reading "
                             "and moving to the spot (default 0)")
    parser.add_argument("--newline-ms", type=float, default=600.0, help="time after a newline (default 600)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=setting,
                        help="a memosight setting for both memosight systems (repeatable)")
    parser.add_argument("--llama-threads", type=int, default=None,
                        help="llama-server threads (default: its own default, as a user runs it)")
    parser.add_argument("--llama-spec", metavar="TYPE",
                        help="llama-server speculating by itself for the llama-server systems (--spec-type TYPE: "
                             "ngram-mod, ngram-simple, ...; default: none)")
    parser.add_argument("--server-log", metavar="PREFIX",
                        help="the memosight systems' debug logs, to PREFIX-SYSTEM.log")
    parser.add_argument("--plot", metavar="FILE.png", help="characters saved and latency per system (matplotlib)")
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)


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


def llama_server_bin(args) -> Path:
    """The native llama-server's folder, checked with --gguf before any typing starts."""
    from memosight.engine.bench.llama_server import native_bin_dir

    if not args.gguf:
        raise CommandError("the llama-server systems need --gguf FILE (the same model memosight runs; "
                           "`memosight export gguf --out FILE` writes the embedded one)")
    if not Path(args.gguf).is_file():
        raise CommandError(f"--gguf {args.gguf!r} is not a file")
    bin_dir = native_bin_dir()
    if bin_dir is None:
        raise CommandError("no native llama-server for this CPU: build it with `bash engine/bench/"
                           "build_llama_cpp.sh` (about 20 minutes on 2 cores), or set MEMOSIGHT_LLAMA_SERVER")
    return bin_dir


def llama_server_for(args):
    """A fresh native llama-server on --gguf, with llama.vim's recommended flags."""
    from memosight.engine.bench.llama_server import LlamaServer

    spec = ["--spec-type", args.llama_spec] if getattr(args, "llama_spec", None) else []
    return LlamaServer(Path(args.gguf), args.llama_threads, llama_server_bin(args), n_ctx=0,
                       extra=["--cache-reuse", "256", "-ub", "1024", "-b", "1024", *spec])


def make_system(name: str, args, server):
    options = {"model": args.model} if args.model else {}
    options.update(dict(args.set))
    log = f"{args.server_log}-{name}.log" if args.server_log else None
    if name == "memosight":
        from ..bench.typing_lsp import LspSystem

        return LspSystem(name, options, log_file=log)
    if name == "memosight-llamacpp":
        from ..bench.typing_lsp import LspSystem

        # No fallback, so every figure is llama-server's; its timeouts as a user of a CPU server sets
        # them (the defaults, 2 s to the first token, are for a team's GPU server: a cold prompt of
        # Qwen2.5-Coder-0.5B on 2 cores takes longer, and llama.vim waits for it too).
        options["backend"] = {"kind": "llamacpp", "url": server.url, "fallback": "none",
                              "first_token_timeout_ms": 30000, "timeout_ms": 60000}
        if args.model:  # its tokenizer counts the budget and renders the FIM prompt
            options["backend"]["tokenizer"] = args.model
        return LspSystem(name, options, model_pid=server.process.pid, log_file=log)
    from ..bench.typing_llamavim import LlamaVimSystem

    return LlamaVimSystem(server.url, server_pid=server.process.pid)


async def run_system(name: str, functions, args) -> dict:
    server = llama_server_for(args) if name != "memosight" else None
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


async def bench(args) -> dict:
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise CommandError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if any(name != "memosight" for name in names):
        llama_server_bin(args)
    functions = pick_functions(args.corpus, args.functions, args.max_chars, random.Random(args.seed))
    if not functions:
        raise CommandError(f"no function of at most {args.max_chars} characters under {args.corpus}")
    results = [await run_system(name, functions, args) for name in names]
    base = next((r for r in results if r["system"] == "llamavim"), None)
    for r in results:
        r["vs_llamavim"] = (round(r["chars_saved"] / base["chars_saved"], 2) if base and base["chars_saved"]
                            else None)
    return {"clock": "real", "key_ms": args.key_ms, "newline_ms": args.newline_ms, "read_ms": args.read_ms,
            "seed": args.seed,
            "model": args.model or "embedded", "gguf": args.gguf, "settings": dict(args.set),
            "functions": [f"{p.name}:{t.count(chr(10), 0, s) + 1}" for p, t, s, _ in functions],
            "systems": results}


def render(result: dict) -> str:
    reading = f", {result['read_ms']:g} ms reading a file before its first key" if result.get("read_ms") else ""
    lines = [f"typing at {result['key_ms']:g} ms a key, {result['newline_ms']:g} ms after a newline{reading} (real clock); "
             f"model {result['model']}; functions {', '.join(result['functions'])}"
             + (f"; memosight settings {result['settings']}" if result.get("settings") else ""),
             f"{'system':<20}{'keys':>6}{'visible':>9}{'saved':>7}{'share':>8}{'vs vim':>8}{'takes':>7}{'mean':>6}"
             f"{'p50 ms':>8}{'p95 ms':>8}{'reqs':>6}{'cpu s/char':>11}"]
    for r in result["systems"]:
        lat = r["latency_ms"]
        vs = "-" if r["vs_llamavim"] is None else f"{r['vs_llamavim']:.2f}x"
        per = "-" if r["model_cpu_s_per_saved_char"] is None else f"{r['model_cpu_s_per_saved_char']:.3f}"
        lines.append(f"{r['system']:<20}{r['keys']:>6}{r['visible_in_time']:>9}{r['chars_saved']:>7}"
                     f"{r['chars_saved_share']:>8.1%}{vs:>8}{r['acceptances']:>7}{r['mean_acceptance_chars']:>6}"
                     f"{lat['p50'] if lat['p50'] is not None else '-':>8}"
                     f"{lat['p95'] if lat['p95'] is not None else '-':>8}{r['requests']:>6}{per:>11}")
    for r in result["systems"]:
        if r["notes"]:
            lines.append(f"{r['system']}: {r['notes']}")
    return "\n".join(lines)


def plot(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["system"] for r in result["systems"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, [100 * r["chars_saved_share"] for r in result["systems"]])
    left.set_ylabel("characters saved (%)")
    right.bar(names, [r["latency_ms"]["p50"] or 0 for r in result["systems"]], label="p50")
    right.bar(names, [(r["latency_ms"]["p95"] or 0) - (r["latency_ms"]["p50"] or 0) for r in result["systems"]],
              bottom=[r["latency_ms"]["p50"] or 0 for r in result["systems"]], alpha=0.5, label="p95")
    right.set_ylabel("edit -> suggestion on screen (ms)")
    right.legend()
    fig.suptitle(f"{result['model']}, {result['key_ms']:g}/{result['newline_ms']:g} ms")
    fig.tight_layout()
    fig.savefig(out)


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(bench(args))
    if args.plot:
        plot(result, args.plot)
    print_result(result, args.json, render, cpu=True)
    return 0
