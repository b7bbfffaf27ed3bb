"""`memosight bench soak --corpus DIR [--keystrokes 2000] [--json]`: long typing with faults injected.

Two `memosight-lsp --stdio` processes: the one under test, started as memosight.server.with_faults (its engine
raises in the middle of some generations and stalls before others, through the engine protocol), and
a reference without faults that sees the same edits. Functions cut out of real files are typed back
into several open documents (files beside a temporary workspace), switching between them, in bursts: a burst
ends in an inline completion request, cancelled when typing resumes before its answer and sometimes
superseded at once by a second request; a finished function's document is closed and the next one
opened; the workspace's `.memosight.toml` is rewritten every so often, with valid and broken text.

Reported: keystrokes, requests and how many were answered (a result or an error: every request must
be), faults injected, the first completion after each fault beside the reference server's (the
document's text opened anew in both and completed at its cursor: greedy decoding is deterministic,
so they must be equal; the same probe at random answers with no fault before is the control),
suggestions for a text that is no longer current (must be 0), the server's memory over the run, and
whether it is still completing and exits cleanly.
"""

from __future__ import annotations

import argparse
import asyncio

from ..bench.soak import soak
from .common import MODEL_HELP, add_json_argument, print_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of Python source files (held-out code)")
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--keystrokes", type=int, default=2000, help="keystrokes to type in all")
    parser.add_argument("--documents", type=int, default=4, help="documents open at once")
    parser.add_argument("--faults", default="raise=0.04,slow=0.04,slow_ms=400",
                        help="the fault plan of the server under test (memosight.server.with_faults --faults)")
    parser.add_argument("--key-ms", type=float, default=25.0, help="time between keystrokes in a burst")
    parser.add_argument("--pause-ms", type=float, default=150.0, help="how long a burst's request is waited for")
    parser.add_argument("--supersede", type=float, default=0.1, help="share of requests sent twice at once")
    parser.add_argument("--switch", type=float, default=0.25, help="share of bursts that move to another document")
    parser.add_argument("--control", type=float, default=0.1,
                        help="share of answers without a fault before them also probed (a control)")
    parser.add_argument("--config-every", type=int, default=150, help="keystrokes between config rewrites")
    parser.add_argument("--server-log", metavar="FILE", help="the log of the server under test")
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)


def render(result: dict) -> str:
    rss, faults, check, control = result["rss_mb"], result["faults"], result["after_fault"], result["control"]
    return "\n".join([
        f"model {result['model']}  device {result['device']}  faults {result['fault_plan']}  "
        f"{result['duration_s']} s",
        f"keystrokes {result['keystrokes']} in {result['documents_opened']} documents  "
        f"config rewrites {result['config_rewrites']}",
        f"requests {result['requests']}  answered {result['answered']} (unanswered {result['unanswered']}, "
        f"errors {result['answered_with_error']})  with a suggestion {result['with_suggestion']}",
        f"cancelled by the client {result['cancelled_by_client']}  superseding {result['superseding_requests']}  "
        f"stale suggestions {result['stale_suggestions']} (crossed cancellations {result['crossed_cancellations']})",
        f"faults injected: raised {faults['raised']}, slowed {faults['slowed']} of {faults['streams']} generations; "
        f"equal to the reference: the first completion after a fault {check['matched']}/{check['checked']}, "
        f"control probes {control['matched']}/{control['checked']}",
        f"server RSS: start {rss['start']} MB, after warm-up {rss['after_warm_up']} MB, end {rss['end']} MB "
        f"(growth after warm-up {rss['growth_after_warm_up']} MB), peak {result['peak_rss_mb']} MB",
        f"popups {result['popups']}  completing at the end {result['completing_at_end']}  "
        f"exit code {result['exit_code']}"])


def run(args: argparse.Namespace) -> int:
    print_result(asyncio.run(soak(args)), args.json, render, cpu=True)
    return 0
