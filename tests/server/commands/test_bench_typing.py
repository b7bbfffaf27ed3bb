"""`memosight bench typing` end to end: a real run into memosight-lsp, and a clear error for a missing --gguf
(the typist itself: tests/server/bench/test_typist.py)."""

from pathlib import Path


def test_the_command_types_into_memosight_lsp_and_reports_every_figure(tmp_path, tiny_model_dir):
    """A short real run: one function of the sample file typed into memosight-lsp --stdio (a tiny
    model) a key every 60 ms, past the client's 50 ms debounce so that it asks; the llama-server
    systems left out (they have tests of their own)."""
    import json
    import subprocess
    import sys

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "sample.py").write_text((Path(__file__).parents[2] / "data" / "sample.py").read_text())
    out = subprocess.run(
        [sys.executable, "-m", "memosight.server.cli", "bench", "typing", "--corpus", str(corpus),
         "--model", str(tiny_model_dir), "--systems", "memosight", "--functions", "1", "--max-chars", "300",
         "--key-ms", "60", "--newline-ms", "60", "--json"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    (r,) = result["systems"]
    assert r["system"] == "memosight" and result["clock"] == "real" and result["cpu"]
    assert 0 <= r["chars_saved"] <= r["chars"] and r["acceptances"] <= r["keys"] <= r["chars"] and r["chars"] > 0
    assert r["requests"] > 0 and r["model_cpu_s"] > 0 and r["notes"]["first_answer_s"] > 0


def test_a_llama_server_system_without_gguf_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "memosight.server.cli", "bench", "typing", "--corpus", str(tmp_path),
                          "--systems", "llamavim"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--gguf" in out.stderr
