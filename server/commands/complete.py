"""`memosight complete FILE:LINE:COL [--json]`: the suggestion an editor would show at that cursor."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from .common import CommandError, add_json_argument
from .cursor import add_model_arguments, load_document, parse_cursor, settings_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cursor", type=parse_cursor, metavar="FILE:LINE:COL", help="1-based line and column")
    add_model_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, help="longest completion in tokens (default 64)")
    parser.add_argument("--multiline", choices=["auto", "always", "never"], help="default: auto")
    parser.add_argument("--budget", type=int, dest="context_budget", help="prompt token budget (default 1024)")
    parser.add_argument("--token-healing", action=argparse.BooleanOptionalAction, default=None,
                        help="end the prompt at a token boundary and let the model rewrite the cut text "
                             "(default: on, or the config's token_healing)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run N times from cold caches and report the median latency (default 1)")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..request.records import Ticket
    from ..request.suggest import Suggester

    overrides = {"model": args.model, "device": args.device, "dtype": args.dtype,
                 "max_new_tokens": args.max_new_tokens, "multiline": args.multiline,
                 "context_budget": args.context_budget, "token_healing": args.token_healing}
    settings = settings_for(args.cursor.path, overrides)
    doc, cursor = load_document(args.cursor)
    suggester = Suggester(fallback=False)
    load_start = time.perf_counter()
    engine = suggester.ensure_engine(settings).result()  # a model that fails to load: EngineError
    load_ms = (time.perf_counter() - load_start) * 1000
    latencies = []
    for _ in range(max(1, args.repeat)):
        suggester.forget(doc.uri)  # each run is a fresh request, not typing-through
        answer = asyncio.run(suggester.suggest(Ticket.of(doc, cursor), settings, cold=True))
        if answer.messages:
            raise CommandError("; ".join(answer.messages))
        suggestion = answer.suggestion
        if suggestion is not None:
            latencies.append(suggestion.latency_ms)
    text = suggestion.text if suggestion else ""
    latency = statistics.median(latencies) if latencies else None
    status = engine.status()
    backend = status.get("backend") or {}
    runtime = f"{backend['kind']} backend" if backend else status.get("runtime")
    if args.json:
        print(json.dumps({"completion": text, "latency_ms": latency, "latencies_ms": [round(x, 2) for x in latencies],
                          "load_ms": round(load_ms, 1),
                          "prompt_tokens": suggestion.prompt_tokens if suggestion else None,
                          "stop_reason": suggestion.stop_reason if suggestion else None,
                          "model": status["model"], "runtime": runtime, "device": status["device"],
                          "dtype": status["dtype"], "runtime_choice": status.get("runtime_choice"),
                          "dtype_choice": status.get("dtype_choice"), "cpu": status.get("cpu")}))
    else:
        line, col = args.cursor.line, args.cursor.column
        print(f"{args.cursor.path}:{line}:{col}  model={status['model']} runtime={runtime} "
              f"dtype={status['dtype']} device={status['device']}")
        print("--- completion ---")
        print(text if text else "(no suggestion)")
        print("------------------")
        if latency is not None:
            runs = f"median of {len(latencies)} cold runs, " if len(latencies) > 1 else ""
            print(f"latency: {latency:.1f} ms ({runs}{suggestion.prompt_tokens} prompt tokens; "
                  f"model load {load_ms:.0f} ms, not included)")
    suggester.close()  # engine thread joined: torch must not be busy while Python exits
    return 0
