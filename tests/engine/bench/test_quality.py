"""`memosight bench quality` on a tiny folder with a tiny model: the report and its JSON keys."""

from __future__ import annotations

import argparse
import json
import random

from memosight.engine.bench import quality

CODE = "import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"


def test_sampled_lines_put_the_cursor_after_the_indentation():
    samples = quality.sample_lines("m.py", CODE, per_file=10, rng=random.Random(0))
    by_line = {s.line: s for s in samples}
    assert by_line[5].target == "return os.path.join(a, b)" and by_line[5].prefix.endswith("\n    ")
    assert by_line[5].suffix.startswith("\n\n\nclass Box")
    for s in samples:
        assert s.prefix + s.target + s.suffix == CODE


def test_bench_prints_one_json_object(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "m.py").write_text(CODE)
    (tmp_path / "n.py").write_text(CODE.replace("Box", "Crate"))
    parser = argparse.ArgumentParser()
    quality.add_arguments(parser)
    args = parser.parse_args(["--corpus", str(tmp_path), "--model", str(tiny_model_dir), "--json",
                              "--max-new-tokens", "4", "--lines-per-file", "2", "--seq-len", "32"])

    assert quality.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"loss", "top1_accuracy", "next_line_exact", "next_line_fim_exact", "next_line_samples", "files",
            "tokens"} <= report.keys()
    assert report["files"] == 2 and report["next_line_samples"] == 4 and report["loss"] > 0
