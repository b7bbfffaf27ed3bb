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
from pathlib import Path

from ..bench.typist import SYSTEMS, bench
from .bench_replay import setting
from .common import CommandError, add_json_argument, print_result


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


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise CommandError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if any(name != "memosight" for name in names):
        llama_server_bin(args)  # before any typing starts
    result = asyncio.run(bench(args, names, lambda: llama_server_for(args)))
    if args.plot:
        plot(result, args.plot)
    print_result(result, args.json, render, cpu=True)
    return 0
