"""`memosight bench replay --corpus DIR [--json]`: real files typed back into the real server.

A function is cut out of a real source file; the file without it is opened in `memosight-lsp
--stdio` (a separate process, spoken to over its pipes as an editor would), and the function is
typed back keystroke by keystroke in bursts. After each burst an inline completion is requested.
With a pause (`--pause 400`), typing resumes after it and a request still pending then is cancelled,
as VS Code does; with `--pause 0` (an editor that does not debounce) every answer is waited for and
typing goes on at once. When a suggestion's start matches what comes next (3 characters or more),
the simulated user accepts that part. `--breakdown` matches the server's per-stage timings
(timeline.py) to each request's latency as this client measured it.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from memosight.engine.bench.common import table  # plain text, no torch

from ..bench.replay import replay
from .common import MODEL_HELP, add_json_argument, print_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of Python source files (held-out code)")
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--functions", type=int, default=6, help="functions to type back")
    parser.add_argument("--max-chars", type=int, default=400, help="skip functions longer than this")
    parser.add_argument("--min-lines", type=int, default=None,
                        help="only functions of files at least this long (a large file, as users have them)")
    parser.add_argument("--burst", type=burst_sizes, default=None, metavar="MIN,MAX",
                        help="keystrokes typed before each request, drawn between MIN and MAX (default 2,9)")
    parser.add_argument("--key-ms", type=float, default=None, help="time between keystrokes in a burst (default 60)")
    parser.add_argument("--pause", "--pause-ms", dest="pauses", type=pauses, default=None, metavar="MS[,MS...]",
                        help="pause after a burst, when a request is sent (default 400); 0: no pause, each answer "
                             "waited for; a comma list runs each mode in turn, e.g. --pause 0,400")
    parser.add_argument("--pattern", choices=["replay", "bursts"], default="replay",
                        help="bursts: the pattern of an editor client that sends typed characters at once and "
                             "asks after each burst of 1-6, in a large file (--key-ms 0 --burst 1,6 --min-lines "
                             "1000 --pause 0 --workspace corpus, unless given)")
    parser.add_argument("--workspace", choices=["none", "corpus"], default=None,
                        help="the workspace folder the editor opens: none, or the corpus folder (indexed for "
                             "definitions, as a project is); default none, corpus with --pattern bursts")
    parser.add_argument("--breakdown", action="store_true",
                        help="where each request's milliseconds went, stage by stage (the server's timings)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="with --breakdown: a stacked latency bar per request (needs matplotlib)")
    parser.add_argument("--min-accept", type=int, default=3, help="matching characters a user accepts")
    parser.add_argument("--server-log", metavar="FILE", help="the server's debug log (one line per completion)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", type=setting,
                        help="a server setting, as an editor would send it (repeatable), e.g. --set "
                             "prefill_on_edit=false --set context_budget=512")
    parser.add_argument("--backend", metavar="KIND=URL",
                        help="type through a serving engine: openai=http://host:8000/v1 or llamacpp=http://host:8080 "
                             "(no local fallback, so every figure is the server's); --model then names its tokenizer")
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)


PATTERNS = {  # the defaults of each typing pattern, for the options not given
    "replay": {"key_ms": 60.0, "burst": (2, 9), "min_lines": 0, "pauses": [400.0], "workspace": "none"},
    "bursts": {"key_ms": 0.0, "burst": (1, 6), "min_lines": 1000, "pauses": [0.0], "workspace": "corpus"},
}


def apply_pattern(args: argparse.Namespace) -> None:
    for key, value in PATTERNS[args.pattern].items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def pauses(spec: str) -> list[float]:
    try:
        values = [float(v) for v in spec.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, e.g. 400 or 0,400; got {spec!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("a pause cannot be negative")
    return values


def burst_sizes(spec: str) -> tuple[int, int]:
    try:
        low, high = (int(v) for v in spec.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX keystrokes, e.g. 1,6; got {spec!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {spec!r}")
    return low, high


def setting(spec: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as JSON where it is JSON (numbers, true/false), else as a string."""
    key, sep, value = spec.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {spec!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def render(result: dict) -> str:
    if "modes" in result:
        return "\n\n".join(render(mode) for mode in result["modes"])
    lat = result["latency_ms"]
    mode = "no pause: every answer waited for" if not result["pause_ms"] else f"pause {result['pause_ms']:g} ms"
    lines = [
        f"model {result['model']}  device {result['device']}  runtime {result.get('runtime')}  "
        f"functions {result['functions']}  {mode}",
        f"first answer {result['first_answer']['ms']:.0f} ms after the server was spawned "
        f"({result['first_answer']['text']!r})" if result.get("first_answer") else "first answer: not measured",
        f"requests {result['requests']}  answered {result['answered']}  with a suggestion {result['with_suggestion']}",
        f"latency  p50 {lat['p50']} ms  p95 {lat['p95']} ms  max {lat['max']} ms",
        f"typed-through share {result['typed_through_share']:.1%}   joined generations {result['joined']}",
        f"prompt tokens from the KV cache {result['kv_cache_share']:.1%}",
        _prefilled(result.get("prefilled_per_keystroke")),
        f"characters saved {result['chars_saved']} of {result['chars_saved'] + result['chars_typed']} "
        f"({result['chars_saved_share']:.1%}), {result['accepted']} acceptances; {result['chars_shown']} shown "
        f"({result['chars_saved_of_shown']:.1%} of them taken)",
        f"cancelled by the client {result['cancelled_by_client']}  server: cancelled {result['server_cancelled']} "
        f"superseded {result['server_superseded']}  stale suggestions {result['stale_suggestions']} "
        f"(answers that crossed a cancellation: {result['crossed_cancellations']})",
        f"server peak memory {result['server_peak_rss_mb']} MB"]
    if (b := result.get("backend")):
        lines.append(f"backend {b['kind']} {b['url']}: state {b['state']}, cancelled {b['cancelled']}, shared prompt "
                     f"start {b['shared_prefix_share']}, server-cached share {b['server_cached_share']}")
    if result.get("breakdown"):
        lines.append(render_breakdown(result["breakdown"]))
    return "\n".join(lines)


def _prefilled(p: dict | None) -> str:
    if not p:
        return "tokens prefilled per keystroke: no request ran the model"
    causes = ", ".join(f"{cause} {c['requests']} requests / {c['tokens']} tokens" for cause, c in p["by_cause"].items())
    return (f"tokens prefilled per keystroke (its warm-ups included, {p['ahead_share']:.0%} of them): "
            f"p50 {p['p50']:g}  p95 {p['p95']:g}  mean {p['mean']:g}; where the prompt moved: {causes}")


def run(args: argparse.Namespace) -> int:
    apply_pattern(args)
    print_result(asyncio.run(replay(args)), args.json, render, cpu=True)
    return 0


def render_breakdown(b: dict) -> str:
    if not b["requests"]:
        return "breakdown: no answered request was matched to the server's timings"
    rows = [{"stage": name, **v} for name, v in b["stages"].items()]
    rows.append({"stage": "= server total", **b["server_ms"]})
    rows.append({"stage": "client measured", **b["client_ms"]})
    steps = b["decode_steps"]
    share = b["server_share_of_client"]  # None when the client measured no time at all
    return "\n".join([
        f"breakdown of {b['requests']} answered requests ({', '.join(f'{k} {v}' for k, v in b['kinds'].items())}), ms:",
        table(rows, [("stage", "stage"), ("p50", "p50"), ("p95", "p95"), ("mean", "mean")]),
        f"the server's stages account for {'-' if share is None else f'{share:.1%}'} of the client's latency (transport: "
        "the rest)",
        f"tokens a request {b['tokens_per_request']}, decoding {b['decode_ms_per_token']} ms a token; stops "
        + ", ".join(f"{k} {v}" for k, v in b["stop_reasons"].items()),
        f"decoding steps {steps['count']}: {steps['drafted']} draft nodes verified, {steps['accepted']} accepted, "
        f"{steps['ms_mean']} ms a step"])
