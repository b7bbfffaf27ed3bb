import json
from pathlib import Path

from memosight.server.cli import main

SAMPLE = Path(__file__).parents[2] / "data" / "sample.py"


def test_complete_prints_the_suggestion_and_its_latency(capsys, repeater_model_dir):
    assert main(["complete", f"{SAMPLE}:33:20", "--model", str(repeater_model_dir), "--max-new-tokens", "5",
                 "--repeat", "2", "--no-token-healing", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completion"] == "xxxxx"
    assert out["latency_ms"] > 0 and len(out["latencies_ms"]) == 2
    assert out["device"] == "cpu" and out["runtime"] == "torch"  # a model folder: transformers
    assert out["runtime_choice"]["runtime"] == "torch"
    # a figure names the CPU it was taken on, and how dtype "auto" was decided there
    assert set(out["cpu"]) == {"model_name", "capability", "onednn_isa", "threads", "cores"}
    assert out["dtype"] == out["dtype_choice"]["dtype"] and "float32" in out["dtype_choice"]["keystroke_ms"]


def test_complete_with_a_missing_model_is_one_clear_line(capsys, tmp_path):
    assert main(["complete", f"{SAMPLE}:33:20", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_context_prints_the_design_keys(capsys, repeater_model_dir):
    assert main(["context", f"{SAMPLE}:33:20", "--budget", "128", "--model", str(repeater_model_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"prefix", "suffix", "prompt_tokens", "regions"}
    assert out["prompt_tokens"] <= 128
    assert all(set(r) >= {"path", "start_line", "end_line", "kind", "score"} for r in out["regions"])


def test_context_takes_several_cursors_and_prints_one_object_per_line(capsys, repeater_model_dir, tmp_path):
    cursors = [f"{SAMPLE}:33:20", f"{tmp_path / 'missing.py'}:1:1", f"{SAMPLE}:10:1"]
    assert main(["context", *cursors, "--budget", "128", "--model", str(repeater_model_dir), "--json"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["cursor"] for line in lines] == cursors
    assert "is not a file" in lines[1]["error"]  # one bad cursor, the others still answered
    for line in (lines[0], lines[2]):
        assert set(line) >= {"prefix", "suffix", "prompt_tokens", "regions"} and line["prompt_tokens"] <= 128
    assert lines[0]["prefix"] != lines[2]["prefix"]


def test_the_quick_start_command_exits_cleanly():
    import subprocess
    import sys

    sample = Path(__file__).parents[2] / "data" / "sample.py"
    for _ in range(2):  # the engine was once closed on a background thread while Python exited: abort, 134
        out = subprocess.run([sys.executable, "-m", "memosight.server.cli", "complete", f"{sample}:33:20"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-500:]
        assert "--- completion ---" in out.stdout
