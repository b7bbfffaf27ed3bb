"""`memosight bench fuzz [--seeds 5] [--messages 10000] [--no-heavy] [--json]`: a hostile client, at
scale, on a real server.

For each seed a fresh `memosight-lsp --stdio` (the embedded model, or --model), once its model is
loaded, gets the seeded stream of fuzz_stream.py as fast as it reads it (heavy documents of 5, 9 and
--huge-mb MB among it, unless --no-heavy), with a `memosight/status` every 200 messages that
nothing waits for. Then 40 edits around characters outside ASCII, each followed by the server's
digest of that document; then the checks below; then a burst of completion requests and edits,
and stdin closed with no shutdown or exit. A second, short-lived server per seed gets a burst while
its model loads, then `exit` without `shutdown`.

Checked for every seed: every well-formed request answered exactly once; every document the server
holds equal to the client's copy (memosight/status {"digests": true}), and the non-ASCII document
after each step; no completion request answered "not open" for a document open when it was sent,
and no completion item built on another version of the document than the request's (its range and
text checked against the client's copy as of the request); the client-fed acceptance counters
within what the server answered; a completion in a new document; both servers leaving with code 0
or 1, never by a signal. Reported beside them: the messages by kind, the latency of completion
requests (sent to answered: p50, p95, max), the -32801 (content modified) and other error answers,
seconds, and the server's peak resident memory (VmHWM: the most it ever held) beside its own
memory report taken at the highest RSS it reported (what each bounded structure held then).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from ..bench.fuzz import EXIT_TIMEOUT_S, fuzz, run_passed
from .common import MODEL_HELP, CommandError, add_json_argument, print_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=5, help="runs, seeds 0..N-1 (default 5; 0: the stalled client alone)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--messages", type=int, default=10_000, help="messages a run (default 10000)")
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--heavy", action=argparse.BooleanOptionalAction, default=True,
                        help="heavy documents in the stream: 5 MB, 9 MB (over the 8 MB completion limit) and "
                             "--huge-mb in turn, with 50,000-character lines (default on; --no-heavy: a run to "
                             "compare latency and memory with)")
    parser.add_argument("--huge-mb", type=float, default=12.0,
                        help="size of the largest heavy documents (default 12 MB)")
    parser.add_argument("--stalled-requests", type=int, default=3000,
                        help="then a client that sends this many requests while not reading (0: none)")
    parser.add_argument("--stall-s", type=float, default=20.0, help="how long it does not read (default 20 s)")
    parser.add_argument("--server-log", metavar="PREFIX", help="write each run's server log to PREFIX-SEED.log")
    add_json_argument(parser)


def describe_exit(code: int | None) -> str:
    if code is None:
        return f"still running after {EXIT_TIMEOUT_S:g} s (killed)"
    if code < 0:
        return f"KILLED BY {signal.Signals(-code).name}"
    return f"exit code {code}"


def describe_latency(lat: dict) -> str:
    if not lat["count"]:
        return "none"
    return f"p50 {lat['p50']} ms, p95 {lat['p95']} ms, max {lat['max']} ms over {lat['count']}"


def describe_memory(report: dict | None) -> str:
    """A memory report as `name value` pairs, the nested ones in parentheses."""
    if not report:
        return "none"
    return ", ".join(f"{k} ({', '.join(f'{k2} {v2}' for k2, v2 in v.items())})" if isinstance(v, dict) else f"{k} {v}"
                     for k, v in report.items())


def render_run(r: dict) -> list[str]:
    c, acc = r["completions"], r["acceptances"]
    crashed = f", CRASHED: {r['crashed']}" if r["crashed"] else ""
    return [
        (f"  seed {r['seed']}: {'passed' if run_passed(r) else 'FAILED'}; unanswered {r['unanswered']}, "
         f"answered twice {r['answered_twice']}, documents differ {r['documents_differ_count']} of "
         f"{r['documents_checked']}, completes after: {r['completes_after']}, {r['total_s']} s{crashed}"),
        (f"    completion requests: latency {describe_latency(c['latency_ms'])} (in heavy documents: "
         f"{describe_latency(c['latency_in_heavy_documents_ms'])}); answered 'not open' {c['not_open']}, "
         f"items built on another version {c['built_on_another_version']} of {c['items_checked']} checked, "
         f"content modified (-32801) {c['content_modified']}, other errors {c['other_errors'] or 'none'}"),
        (f"    non-ASCII edits: {r['non_ascii_steps_differ']} of {r['non_ascii_steps']} steps differ by digest; "
         f"acceptances {acc.get('accepted')} ({acc.get('accepted_chars')} chars) of {acc.get('completed')} "
         f"completed: {'bounded' if acc['bounded'] else 'NOT BOUNDED'}"),
        (f"    leaving with work in flight: stdin closed -> {describe_exit(r['closed_stdin_exit_code'])}; "
         f"exit without shutdown -> {describe_exit(r['exit_code'])}"),
        (f"    peak RSS {r['peak_rss_mb']} MB (VmHWM); the server's report at the highest RSS of "
         f"{r['memory_reports']}: {describe_memory(r['memory_at_peak'])}"),
    ]


def render(result: dict) -> str:
    verdict = "every check passed" if result["all_checks_passed"] else "CHECKS FAILED"
    head = (f"{result['messages']} messages over {result['seeds']} seeds ({result['requests']} well-formed "
            f"requests), model {result['model']}, heavy documents {'on' if result['heavy'] else 'off'}: "
            f"{verdict}; peak RSS {result['peak_rss_mb']} MB; completion latency "
            f"{describe_latency(result['completion_latency_ms'])}")
    lines = [head]
    for r in result["runs"]:
        lines += render_run(r)
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
