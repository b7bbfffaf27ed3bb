import json

from memosight.server.cli import main


def test_a_short_fuzz_run_and_a_stalled_client_pass_every_check(capsys):
    code = main(["bench", "fuzz", "--seeds", "1", "--messages", "600", "--huge-mb", "1",
                 "--stalled-requests", "2000", "--stall-s", "4", "--json"])
    result = json.loads(capsys.readouterr().out)
    (run,) = result["runs"]
    assert code == 0 and result["all_checks_passed"], result
    assert run["requests"] > 100 and run["unanswered"] == 0 and run["answered_twice"] == 0
    assert run["documents_checked"] >= 4 and run["documents_differ_count"] == 0
    assert run["completes_after"] and run["exited_on_exit_without_shutdown"]
    assert {"wrong_shape", "junk_between_frames", "edit_past_end", "overlapping_edits"} <= set(run["kinds"])
    assert run["peak_rss_mb"] > 0
    stalled = result["stalled_client"]
    assert stalled["answered_once"] == 2000 and stalled["unanswered"] == 0
    assert stalled["sent_during_stall"] < 2000  # the server stopped reading while its answers waited: backpressure
