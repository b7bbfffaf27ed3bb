"""What every `memosight` tool shares: one way to fail, to print a result, and to show progress.

A tool is a module of this package with a docstring (shown under its --help), `add_arguments(parser)`
and `run(args) -> int`. Heavy imports (torch, transformers) happen inside `run`, so `memosight --help`
stays instant. Problems the user can fix raise CommandError (or the engine's EngineError): the
command line prints them as one line, `memosight: ...`, and exits with status 2. Results print as a
human-readable table, or with --json as one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class CommandError(Exception):
    """A problem with the command's input that the user can fix; the message says how."""


MODEL_HELP = ("a model folder, a .gguf file, a catalog name (qwen2.5-coder-0.5b; `memosight model list`), a packaged "
              "name (smollm2-135m) or a Hugging Face id (default: the embedded model)")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def print_result(result: dict, as_json: bool, render: Callable[[dict], str], cpu: bool = False) -> None:
    """The result as one JSON object (--json), or as `render(result)` for a person. `cpu`: a figure
    holds for the CPU it was taken on, so a benchmark's result names it (key `cpu`, a last line)."""
    if cpu:
        from memosight.engine.loading.hardware import cpu_info

        # a result that says its own (a server's engine: None when it ran on a GPU or elsewhere) keeps it
        result = result if "cpu" in result else {**result, "cpu": cpu_info().to_json()}
    text = json.dumps(result) if as_json else render(result)
    if cpu and not as_json and result["cpu"]:
        c = result["cpu"]
        text += (f"\ncpu: {c['model_name']}, torch {c['capability']}, oneDNN {c['onednn_isa']}, "
                 f"{c['threads']} of {c['cores']} threads")
    print(text)


def say(message: str) -> None:
    """A progress or status line: stderr, so that stdout stays the result."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def step_progress(desc: str, unit: str = "step") -> Iterator[Callable[[int, int, dict], None]]:
    """A progress bar on stderr for a run of steps (training steps, benchmark prompts). Yields
    `on_step(step, total, figures)` for the engine to call after each step; the bar starts at the
    first step it hears of (a resumed run starts part-way) and shows `figures` (loss, learning
    rate, ...) beside it."""
    from tqdm import tqdm

    bar = None

    def on_step(step: int, total: int, figures: dict) -> None:
        nonlocal bar
        if bar is None or bar.disable or bar.total != total:  # a run's next stage gets its own bar
            if bar is not None:
                bar.close()
            bar = tqdm(total=total, initial=step - 1, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                       mininterval=2.0)
        bar.set_postfix(figures, refresh=False)
        bar.update(step - bar.n)
        if step >= total:  # done: what the run prints next (evaluation, export) goes below the bar
            bar.close()

    try:
        yield on_step
    finally:
        if bar is not None:
            bar.close()  # a paused or failed run


def process_memory_mb(pid: int, key: str = "VmRSS") -> float | None:
    """A process's memory from /proc (Linux), in MB: VmRSS resident now, VmHWM the most it ever
    held resident. None where it cannot be read (the process ended, another OS)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
