"""Every command that loads a model exits cleanly, run after run: engine threads are joined before
the interpreter exits (a thread still in torch then aborts the process with status 134)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).parents[2] / "data" / "sample.py"
RUNS = 4


@pytest.mark.parametrize("command", [
    ["context", f"{SAMPLE}:33:20", "--budget", "256", "--json"],
    ["complete", f"{SAMPLE}:33:20", "--max-new-tokens", "4", "--json"],
])
def test_each_run_exits_with_status_0_and_complete_output(command, tiny_model_dir):
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, "-m", "memosight.server.cli", *command, "--model", str(tiny_model_dir)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-1000:]
        assert "terminate called" not in out.stderr
        json.loads(out.stdout.strip().splitlines()[-1])  # the whole JSON object, not a cut one
