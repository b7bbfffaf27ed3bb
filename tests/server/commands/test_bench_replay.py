"""The replay benchmark in its short mode: a real function typed back through memosight-lsp --stdio."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from memosight.server.commands.bench_replay import setting

SAMPLE = Path(__file__).parents[2] / "data" / "sample.py"


def test_short_replay_reports_every_figure(tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "sample.py").write_text(SAMPLE.read_text())
    out = subprocess.run(
        [sys.executable, "-m", "memosight.server.cli", "bench", "replay", "--corpus", str(corpus),
         "--model", str(tiny_model_dir), "--functions", "1", "--max-chars", "300", "--key-ms", "2",
         "--pause-ms", "300", "--json"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0 < result["answered"] <= result["requests"]
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p95"]
    assert result["kv_cache_share"] > 0.5  # typing extends the prompt: most of it comes from the KV cache
    assert result["stale_suggestions"] == 0
    for key in ("typed_through_share", "chars_saved_share"):
        assert 0 <= result[key] <= 1, key
    for key in ("server_superseded", "cancelled_by_client"):
        assert 0 <= result[key] <= result["requests"], key


@pytest.mark.parametrize("kind,server", [("openai", "llama_server"), ("llamacpp", "llama_cpp_server")])
def test_replay_runs_unchanged_through_a_real_llama_cpp_server(tmp_path, request, kind, server):
    url, _ = request.getfixturevalue(server)  # llama-cpp-python's server (/v1), llama.cpp's own (/infill)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "sample.py").write_text(SAMPLE.read_text())
    out = subprocess.run(
        [sys.executable, "-m", "memosight.server.cli", "bench", "replay", "--corpus", str(corpus),
         "--backend", f"{kind}={url}", "--functions", "1", "--max-chars", "300", "--key-ms", "2",
         "--pause-ms", "300", "--json"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["answered"] > 0 and result["with_suggestion"] > 0 and result["stale_suggestions"] == 0
    backend = result["backend"]
    assert backend["kind"] == kind and backend["state"] == "ok" and backend["fallback_requests"] == 0
    assert backend["shared_prefix_share"] > 0.5  # consecutive prompts start alike: a prefix cache pays


def test_server_settings_are_read_as_an_editor_would_send_them():
    assert setting("prefill_on_edit=false") == ("prefill_on_edit", False)
    assert setting("context_budget=512") == ("context_budget", 512)
    assert setting("model=smollm2-135m") == ("model", "smollm2-135m")
    with pytest.raises(argparse.ArgumentTypeError):
        setting("no-equals-sign")


def test_no_pause_and_pause_modes_side_by_side_with_a_breakdown_that_adds_up(tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "sample.py").write_text(SAMPLE.read_text())
    plot = tmp_path / "latency.png"
    out = subprocess.run(
        [sys.executable, "-m", "memosight.server.cli", "bench", "replay", "--corpus", str(corpus),
         "--model", str(tiny_model_dir), "--functions", "1", "--max-chars", "300", "--key-ms", "2",
         "--pause", "0,300", "--breakdown", "--plot", str(plot), "--json"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    no_pause, paused = json.loads(out.stdout.strip().splitlines()[-1])["modes"]
    assert (no_pause["pause_ms"], paused["pause_ms"]) == (0, 300)
    # no pause: every request is answered, none cancelled by typing on
    assert no_pause["answered"] == no_pause["requests"] > 0 and no_pause["cancelled_by_client"] == 0
    b = no_pause["breakdown"]
    assert b["requests"] == no_pause["answered"]
    for stage in ("queue", "handler", "engine_wait", "context", "render", "prefill", "decode", "reply", "transport"):
        assert stage in b["stages"], stage
    for row in b["rows"]:  # the server's stages add up to its whole, which this client's clock contains
        server_stages = sum(ms for stage, ms in row["stages_ms"].items() if stage != "transport")
        assert server_stages == pytest.approx(row["server_ms"], rel=0.01, abs=0.05)
    # contained in the client's clock overall (one request's few ms can come out either way on a busy machine:
    # the server's last stamp follows its write, and the two clocks start a pipe apart)
    assert 0.5 < b["server_share_of_client"] <= 1.1
    assert plot.stat().st_size > 10_000


def test_pauses_are_read_as_milliseconds():
    from memosight.server.commands.bench_replay import pauses

    assert pauses("0,400") == [0.0, 400.0]
    with pytest.raises(argparse.ArgumentTypeError):
        pauses("-5")
    with pytest.raises(argparse.ArgumentTypeError):
        pauses("fast")


def test_the_bursts_pattern_is_an_editor_that_asks_after_every_burst_of_one_to_six_in_a_large_file():
    from memosight.server.commands.bench_replay import apply_pattern, burst_sizes

    args = argparse.Namespace(pattern="bursts", key_ms=None, burst=None, min_lines=None, pauses=None, workspace=None)
    apply_pattern(args)
    assert (args.key_ms, args.burst, args.min_lines, args.pauses) == (0.0, (1, 6), 1000, [0.0])
    given = argparse.Namespace(pattern="bursts", key_ms=5.0, burst=(2, 2), min_lines=None, pauses=[400.0], workspace="none")
    apply_pattern(given)  # what is given stays
    assert (given.key_ms, given.burst, given.min_lines, given.pauses) == (5.0, (2, 2), 1000, [400.0])
    assert burst_sizes("1,6") == (1, 6)
    for bad in ("6,1", "0,3", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            burst_sizes(bad)


