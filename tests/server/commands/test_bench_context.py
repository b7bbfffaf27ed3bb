"""`memosight bench context`: the compressor against plain truncation, with and without a model."""

import json

import pytest

from memosight.server.cli import main
from memosight.server.bench.context_measures import _origin_lines


def write_steps(folder) -> None:
    """A module of 50 small functions: cursors inside them and after them."""
    body = "".join(f"def step_{i}(items):\n    \"\"\"Step {i}.\"\"\"\n    total = 0\n    for item in items:\n"
                   f"        total += item * {i}\n    return total\n\n\n" for i in range(50))
    (folder / "mod.py").write_text("import math\n\n\n" + body)


def test_bench_context_runs_without_a_model(tmp_path, capsys):
    # each class its own names: in 60 copies of one body, every body would be "code like this one"
    body = "".join(f"class C{i}:\n    def run(self, items_{i}):\n        total_{i} = LIMIT_{i % 3} + len(items_{i})\n"
                   f"        for item_{i} in items_{i}:\n            total_{i} += item_{i} * {i}\n"
                   f"        return total_{i}\n\n\n" for i in range(60))
    (tmp_path / "consts.py").write_text("".join(f"LIMIT_{i} = {i * 7}\n" for i in range(3)) + "\n" * 80)
    (tmp_path / "big.py").write_text("from consts import LIMIT_0, LIMIT_1, LIMIT_2\n\n\n" + body)
    assert main(["bench", "context", "--corpus", str(tmp_path), "--budget", "256", "--no-model",
                 "--max-positions", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["positions"] == 20 and out["needle_found"] == out["needle_cases"] > 0
    assert out["recall_compressed"] == 1.0  # every far name used at a cursor is in its context
    assert out["origin_identifiers"] > 0 and out["origin_recall_compressed"] >= out["origin_recall_truncated"]
    # While typing, the compressed prompt keeps more of its token prefix than a sliding window does.
    assert out["typing_keystrokes"] > 0 and out["stability_compressed"] > out["stability_truncated"]
    assert out["build_ms_p50"] > 0
    assert 0 < out["build_cold_ms_p50"] <= out["build_cold_ms_max"]
    assert main(["bench", "context", "--corpus", str(tmp_path / "missing"), "--no-model"]) == 2
    assert capsys.readouterr().err.startswith(f"memosight: {tmp_path / 'missing'} is not a folder")


def test_bench_context_with_a_model_reports_exact_match_and_line_loss_for_long_files(tmp_path, tiny_model_dir, capsys):
    body = "".join(f"def step_{i}(items):\n    total = 0\n    for item in items:\n        total += item * {i}\n"
                   f"    return total\n\n\n" for i in range(100))  # 700 lines: a long file
    (tmp_path / "long.py").write_text("import math\n\n\n" + body)
    assert main(["bench", "context", "--corpus", str(tmp_path), "--budget", "256", "--model", str(tiny_model_dir),
                 "--device", "cpu", "--max-positions", "6", "--em-positions", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    groups = out["next_line"]
    assert out["em_positions"] == groups["all"]["compressed"]["positions"] == groups["lines600+"]["truncated"]["positions"] == 3
    assert sum(groups[g]["truncated"]["positions"] for g in ("far", "other_file", "near") if g in groups) == 3
    for name in ("compressed", "truncated", "truncated_2x"):
        figures = groups["all"][name]
        assert figures["exact_match"] * 3 == figures["exact_lines"] in (0, 1, 2, 3)  # lines right, of the 3 asked
        assert 0 <= figures["prefix_chars"] <= figures["prefix_chars_share"] * 1e9
        assert figures["first_request_ms_p50"] > 0 and out[f"first_request_ms_p50_{name}"] > 0
        assert 0 < figures["first_token_ms_p50"] <= figures["first_request_ms_p50"]
        assert figures["line_loss"] > 0 and groups["lines600+"][name]["line_loss"] == figures["line_loss"]
    assert groups["all"]["truncated_2x"]["prompt_tokens_p50"] > groups["all"]["truncated"]["prompt_tokens_p50"]


def test_origin_lines_are_the_first_far_lines_of_each_name():
    lines = ["import os", "LIMIT = 3", ""] + ["x = 1"] * 40 + ["total = LIMIT + os.getpid()"]
    row = len(lines) - 1
    assert _origin_lines(lines, row, {"LIMIT", "os", "total"}) == {"LIMIT": "LIMIT = 3", "os": "import os"}
    assert _origin_lines(lines, 31, {"LIMIT"}) == {}  # row 1 is only 30 lines up: not far


def test_several_budgets_ablations_and_variants_in_one_run(tmp_path, tiny_model_dir, capsys):
    write_steps(tmp_path)
    assert main(["bench", "context", "--corpus", str(tmp_path), "--budget", "64,128", "--model", str(tiny_model_dir),
                 "--device", "cpu", "--max-positions", "4", "--em-positions", "2", "--no-generate",
                 "--ablate", "docstrings", "--variant", "wide:contiguous=0,near_prefix_share=0.5",
                 "--variant", "att:attention=256", "--variant", "fim:suffix_share=0.5",
                 "--cursors-out", str(tmp_path / "cursors.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["budgets"]) == {"64", "128"} and out["budget"] == 64
    cursors = [json.loads(line) for line in (tmp_path / "cursors.jsonl").read_text().splitlines()]
    assert [c["budget"] for c in cursors] == [64, 64, 128, 128]
    for budget, result in out["budgets"].items():
        figures = result["next_line"]["all"]
        assert set(figures) == {"compressed", "compressed_no_docstrings", "wide", "att", "fim", "truncated",
                                "truncated_2x", "window", "window_2x", "window_same",
                                "window_chunks"}  # llama.vim's context beside ours
        for name, f in figures.items():
            assert f["positions"] == 2 and f["line_loss"] > 0 and "exact_match" not in f  # --no-generate
            limit = 2 * int(budget) if name.endswith("_2x") else int(budget)
            assert f["prompt_tokens_p50"] <= limit
            if name != "compressed":  # paired with the packed context's loss on the same cursors
                low, high = f["ci95"]
                assert low <= f["loss_minus_packed"] <= high
                mine = [c for c in cursors if c["budget"] == int(budget)]
                total = sum(c["compressed"]["tokens"] for c in mine)
                assert f["loss_minus_packed"] == pytest.approx(
                    sum(c[name]["nats"] - c["compressed"]["nats"] for c in mine) / total, abs=1e-4)
        assert figures["window_same"]["prompt_tokens_p50"] <= figures["compressed"]["prompt_tokens_p50"]
        # the suffix-share variant stays within the budget too
        fim = [c["fim"]["prompt_tokens"] for c in cursors if c["budget"] == int(budget)]
        assert all(t <= int(budget) for t in fim)


def test_bad_budgets_kinds_and_variant_keys_are_named(tmp_path, capsys):
    (tmp_path / "m.py").write_text("x = 1\n" * 100)
    for argv, message in ((["--budget", "512,abc"], "give token budgets"),
                          (["--ablate", "comments"], "unknown region kind(s) comments"),
                          (["--variant", "v:speed=3"], "unknown key 'speed'")):
        try:
            code = main(["bench", "context", "--corpus", str(tmp_path), "--no-model", *argv])
        except SystemExit as exit:  # argparse's own usage error
            code = exit.code
        assert code == 2 and message in capsys.readouterr().err


def test_the_suffix_lengths_are_scored_under_one_prefix_and_paired_against_the_longest(tmp_path, tiny_model_dir,
                                                                                       capsys):
    write_steps(tmp_path)
    assert main(["bench", "context", "--corpus", str(tmp_path), "--budget", "256", "--model", str(tiny_model_dir),
                 "--device", "cpu", "--em-positions", "6", "--suffix-lengths", "64,0,8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lengths"] == [0, 8, 64]
    tokens = out["suffix_tokens_mean"]
    assert tokens["0"] == 0 and 0 < tokens["8"] <= 8 < tokens["64"] <= 64  # the server's bound, whole lines
    figures = out["by_cursor"]["all"]
    assert all(f["positions"] == 6 and f["line_loss"] > 0 and f["bits_per_char"] > 0 for f in figures.values())
    assert "loss_minus_longest" not in figures["64"]
    for n in ("0", "8"):
        low, high = figures[n]["ci95"]
        assert low <= figures[n]["loss_minus_longest"] <= high
    assert set(out["by_cursor"]) - {"all"} <= {"mid_function", "function_end", "outside"}


def test_the_recompute_mode_scores_a_keystrokes_moved_cells_against_a_fresh_prefill(tmp_path, embedded_gguf,
                                                                                    capsys):
    write_steps(tmp_path)
    assert main(["bench", "context", "--corpus", str(tmp_path), "--budget", "256", "--model", str(embedded_gguf),
                 "--em-positions", "4", "--recompute", "0,8,all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["burst_chars"] == [1, 6] and set(out["by_cursor"]) == {"mid_function", "function_end"}
    assert out["by_cursor"]["mid_function"]["fresh"]["cursors"] == 2  # (these functions end in `return`: outside)
    for rows in out["by_cursor"].values():
        assert list(rows) == ["fresh", "0", "8", "all"]
        cursors = rows["fresh"]["cursors"]
        assert all(r["cursors"] == cursors for r in rows.values())
        if cursors:
            assert all(r["loss"] > 0 and r["greedy_right"] >= 0 for r in rows.values())
            assert abs(rows["all"]["vs_fresh_pct"]) < 2  # the same path, all computed: fresh's loss
            low, high = rows["0"]["ci95"]
            assert low <= rows["0"]["minus_fresh"] <= high
    assert out["chosen"] in (None, "0", "8", "all")
