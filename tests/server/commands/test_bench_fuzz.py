"""`memosight bench fuzz` end to end: a short run and a stalled client against a real server, and the
way a run is told (the checks themselves: tests/server/bench/test_fuzz.py)."""

import json

from memosight.server.cli import main
from memosight.server.bench.fuzz import run_passed
from memosight.server.commands.bench_fuzz import describe_exit, render


def test_how_a_server_left_is_told():
    assert "SIGABRT" in describe_exit(-6) and describe_exit(1) == "exit code 1"
    assert describe_exit(None).startswith("still running")


def test_a_short_fuzz_run_and_a_stalled_client_pass_every_check(capsys):
    code = main(["bench", "fuzz", "--seeds", "1", "--messages", "600", "--huge-mb", "1",
                 "--stalled-requests", "6000", "--stall-s", "4", "--json"])
    result = json.loads(capsys.readouterr().out)
    (run,) = result["runs"]
    assert code == 0 and result["all_checks_passed"] and run_passed(run), result
    assert run["requests"] > 100 and run["unanswered"] == 0 and run["answered_twice"] == 0
    assert run["documents_checked"] >= 4 and run["documents_differ_count"] == 0
    assert run["completes_after"] and run["exited_on_exit_without_shutdown"] and run["left_on_closed_stdin"]
    assert {"wrong_shape", "junk_between_frames", "edit_past_end", "overlapping_edits", "complete_then_close",
            "complete_then_edit", "heavy_document", "accepted_flood", "non_ascii_step", "burst"} <= set(run["kinds"])
    assert run["non_ascii_steps_differ"] == 0 and run["acceptances"]["bounded"]
    completions = run["completions"]
    assert completions["not_open"] == 0 and completions["built_on_another_version"] == 0
    assert completions["items_checked"] > 0 and completions["latency_ms"]["count"] > 50
    assert run["peak_rss_mb"] > 0 and run["memory_reports"] > 3 and run["memory_at_peak"]["rss_mb"] > 0
    assert "documents" in run["memory_at_peak"]
    stalled = result["stalled_client"]
    assert stalled["answered_once"] == 6000 and stalled["unanswered"] == 0
    # The server stopped reading while its answers waited (backpressure): what got through is what the
    # pipes and the server's read buffer hold, ~1,100 requests here whatever the machine's speed (a
    # busy machine only sends fewer); 6,000 sent leaves that bound far from the total.
    assert stalled["sent_during_stall"] < 3000
    table = render(result)
    assert "every check passed" in table and "p50" in table and "stdin closed -> exit code 0" in table
