"""The replay run's pieces (replay.py): keystrokes as an editor sends them, bursts, the functions picked."""

import random
from pathlib import Path

from memosight.server.bench.replay import bursts, keystrokes, pick_functions

SAMPLE = Path(__file__).parents[2] / "data" / "sample.py"


def test_keystrokes_indent_new_lines_like_an_editor():
    assert keystrokes("a:\n    b\n") == ["a", ":", "\n    ", "b", "\n"]


def test_bursts_cover_every_keystroke():
    keys = keystrokes("def f(x):\n    return x + 1\n")
    assert sum(bursts(keys, random.Random(0)), []) == keys


def test_functions_come_from_files_at_least_min_lines_long(tmp_path):
    (tmp_path / "short.py").write_text(SAMPLE.read_text())
    (tmp_path / "long.py").write_text(SAMPLE.read_text() + "\n" * 2000)
    picked = pick_functions(str(tmp_path), 5, 400, random.Random(0), min_lines=1000)
    assert picked and {path.name for path, *_ in picked} == {"long.py"}
    keys = keystrokes("def f(x):\n    return x + 1\n")
    assert all(1 <= len(b) <= 6 for b in bursts(keys, random.Random(0), (1, 6))[:-1])
