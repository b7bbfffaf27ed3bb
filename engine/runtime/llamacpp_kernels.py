"""What the llama.cpp runtime measures about this machine's kernels at load, once per CPU, build,
file and thread count (runtime/choice.py keeps the figures in the cache folder): which batch sizes
give the same logits bit for bit (the kernel classes: llamacpp.py says why they matter), whether a
tree with branches does, whether padding one-row steps into the batched class is cheap, and what a
verification pass of each size costs (the tree sizer's figures)."""

from __future__ import annotations

import numpy as np

from ..decoding.verify import DraftTree
from .llamacpp import MAX_BRANCHES

PROBE_ROWS = 16  # batch sizes tried at load: 1..this
PADDING_PAYS = 1.25  # a step padded to the batched kernels' class may cost this much more than one row
PADDING_MS = 3.0  # ... or this many milliseconds more (a small model: noise on a busy machine)


def measure_kernel_classes(rt, ids: list[int]) -> tuple[int, int]:
    """Which batch sizes (1..PROBE_ROWS) give the same logits, bit for bit, after `ids`: the
    first rows of a chain decoded at each size, compared. Sets (min_rows, exact_rows): the
    fewest rows every decode runs and the widest tree, both in one class."""
    rt._crop(0)
    rt._run(ids, 0)
    past = len(rt.tokens)
    probe = [ids[(k * 7) % len(ids)] for k in range(PROBE_ROWS)]  # tokens of the text itself
    rows_of: dict[int, list[np.ndarray]] = {}
    for size in range(1, PROBE_ROWS + 1):
        rt._decode([(token, past + k, (0,), True) for k, token in enumerate(probe[:size])])
        rows_of[size] = [rt._logits(k) for k in range(min(size, 2))]
        rt.L.llama_memory_seq_rm(rt.memory, 0, past, -1)
    rt._crop(0)

    def same(a: int, b: int) -> bool:  # the rows both sizes have, equal
        return all(np.array_equal(x, y) for x, y in zip(rows_of[a], rows_of[b]))

    classes: list[list[int]] = []
    for size in range(1, PROBE_ROWS + 1):
        if classes and same(classes[-1][0], size) and same(classes[-1][-1], size):
            classes[-1].append(size)
        else:
            classes.append([size])
    rt.kernel_classes = classes
    for earlier, later in zip(classes, classes[1:]):
        a, b = earlier[-1], later[0]
        rt.class_differences[f"{a}-{b}"] = float(np.abs(rows_of[a][0] - rows_of[b][0]).max())
    first = classes[0]
    rt.lossless = True
    if len(first) > 1 or len(classes) == 1:  # one row shares its kernels with small batches
        rt.min_rows, rt.exact_rows = 1, first[-1]
    else:  # one row is a class of its own: every decode runs batched, where that is cheap
        rt.min_rows, rt.exact_rows = classes[1][0], classes[1][-1]
        rt._crop(0)
        rt._run(ids, 0)
        one, padded = _best_pass_ms(rt, 1, 1), _best_pass_ms(rt, 1, rt.min_rows)
        one, padded = min(one, _best_pass_ms(rt, 1, 1)), min(padded, _best_pass_ms(rt, 1, rt.min_rows))
        rt.padding_cost = round(padded / one, 3)
        if padded > PADDING_PAYS * one and padded - one > PADDING_MS:
            # A padded step would cost what a second token does (Qwen2.5-Coder-0.5B on 2 AVX2
            # cores: 54 against 31 ms): plain decoding keeps one row, and a verification pass's
            # logits may differ from a plain step's where they are near a tie (status: lossless)
            rt.min_rows, rt.lossless = 1, False
        rt._crop(0)
    # Branches stay off: the probe below found a two-branch tree exact on both models here, yet
    # with branches `bench speculative` on Qwen2.5-Coder-0.5B left plain decoding's tokens on 1 of
    # 8 prompts (chains alone: 8 of 8). Its figure is kept for status; `verify` takes a tree with
    # branches when max_branches allows (the tests do).
    _branches_exact(rt, ids, probe)
    rt.max_branches = 1
    return rt.min_rows, rt.exact_rows


def _best_pass_ms(rt, rows: int, min_rows: int, repeats: int = 3) -> float:
    saved, rt.min_rows = rt.min_rows, min_rows
    try:
        return min(rt._timed_pass(rows) for _ in range(repeats))
    finally:
        rt.min_rows = saved


def _branches_exact(rt, ids: list[int], probe: list[int]) -> bool:
    """Whether a tree with two branches (each its own sequence) gives its nodes the logits a
    chain gives them, after a decoding step (as in decoding: right after a prefill they agreed
    on Qwen2.5-Coder-0.5B Q4_K_M, one plain step later they were 0.29 apart at the root)."""
    if rt.exact_rows < 3:
        return False
    rt._crop(0)
    rt._run(ids, 0)
    rt.append(probe[-1])
    chain = DraftTree()
    chain.add(probe[0], -1, "probe")
    chain.add(probe[1], 0, "probe")
    expected = rt.verify(chain)
    want = [expected.logits(0), expected.logits(1)]
    rt.L.llama_memory_seq_rm(rt.memory, 0, len(rt.tokens), -1)
    tree = DraftTree()
    tree.add(probe[0], -1, "probe")
    tree.add(probe[1], 0, "probe")
    tree.add(probe[2], 0, "probe")
    rt.max_branches = 2
    got = rt.verify(tree)
    rt.max_branches = 1
    exact = np.array_equal(got.logits(0), want[0]) and np.array_equal(got.logits(1), want[1])
    for b in got.branches.values():
        rt.L.llama_memory_seq_rm(rt.memory, b, -1, -1)
    rt._crop(0)
    rt.branches_difference = float(np.abs(got.logits(0) - want[0]).max())
    return exact


def measure_pass_costs(rt, ids: list[int], sizes, repeats: int = 2) -> dict[int, float]:
    """The best of `repeats` passes of each size after `ids` (a first pass warms the kernels)."""
    rt._crop(0)
    rt._run(ids, 0)
    rt._timed_pass(1)
    rt.known_pass_ms = {rows: round(min(rt._timed_pass(rows) for _ in range(repeats)), 3) for rows in sizes}
    rt._crop(0)
    return rt.known_pass_ms


def figures(rt) -> dict:
    return {"min_rows": rt.min_rows, "exact_rows": rt.exact_rows, "max_branches": rt.max_branches,
            "lossless": rt.lossless, "padding_cost": rt.padding_cost,
            "kernel_classes": rt.kernel_classes, "class_differences": rt.class_differences,
            "branches_difference": getattr(rt, "branches_difference", None),
            "pass_ms": {str(rows): ms for rows, ms in rt.known_pass_ms.items()}}


def restore(rt, figures: dict) -> bool:
    """What measure_kernel_classes found here before (the cache folder's); False if unusable."""
    try:
        min_rows, exact_rows, branches = int(figures["min_rows"]), int(figures["exact_rows"]), int(figures["max_branches"])
    except (KeyError, TypeError, ValueError):
        return False
    if not 1 <= min_rows <= exact_rows <= PROBE_ROWS or branches not in (1, MAX_BRANCHES):
        return False
    rt.min_rows, rt.exact_rows, rt.max_branches = min_rows, exact_rows, branches
    rt.lossless, rt.padding_cost = bool(figures.get("lossless", True)), figures.get("padding_cost")
    rt.kernel_classes = figures.get("kernel_classes") or []
    rt.class_differences = figures.get("class_differences") or {}
    rt.branches_difference = figures.get("branches_difference")
    try:
        rt.known_pass_ms = {int(rows): float(ms) for rows, ms in (figures.get("pass_ms") or {}).items()}
    except (AttributeError, TypeError, ValueError):
        rt.known_pass_ms = {}
    rt.kernels_cached = True
    return True
