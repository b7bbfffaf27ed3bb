"""How many drafted nodes a verification pass carries: as many as pay for their rows.

A pass over r rows costs cost(r) ms on this device: measured by a short calibration the first time
(one pass at each size), then kept current by every real pass. A drafted node is on the accepted
path with probability p: what share of the nodes from the same source, at the same depth and with
a like score (the heads' joint probability, an n-gram's score) greedy decoding agreed with so far. The tree keeps the n
most likely nodes (each with its parent) for which the expected tokens per millisecond,
(1 + sum of their p) / cost(n + 1), is highest; n = 0 is a plain step.

Why measured: the curve differs by orders of magnitude between devices and dtypes. On this 2-core
CPU, SmolLM2-135M, 1 thread: float32 49 ms for 1 row, 103 ms for 16 (every extra row is paid); int8
with packed kernels 30 ms for 1 row, 45 ms for 16 (extra rows nearly free); on a GPU flat to 64.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from .verify import DraftTree

ROW_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the pass sizes whose cost is measured


@dataclass
class PassCost:
    """Running milliseconds of a verification pass by its number of rows (root included)."""

    sizes: tuple[int, ...] = ROW_SIZES
    ms: dict[int, float] = field(default_factory=dict)
    keep: float = 0.9  # how much of the running figure each new pass keeps

    def size_of(self, rows: int) -> int:
        """The measured size a pass of `rows` rows counts under: the nearest at or above it."""
        return self.sizes[min(bisect_left(self.sizes, rows), len(self.sizes) - 1)]

    def record(self, rows: int, ms: float) -> None:
        size = self.size_of(rows)
        old = self.ms.get(size)
        self.ms[size] = ms if old is None else self.keep * old + (1 - self.keep) * ms

    def missing(self) -> list[int]:
        return [s for s in self.sizes if s not in self.ms]

    def __call__(self, rows: int) -> float:
        """Estimated ms of a pass of `rows` rows: linear between the measured sizes around it."""
        known = sorted(self.ms)
        if not known:
            return float(rows)
        below = [s for s in known if s <= rows]
        above = [s for s in known if s >= rows]
        if below and above:
            lo, hi = below[-1], above[0]
            if lo == hi:
                return self.ms[lo]
            return self.ms[lo] + (self.ms[hi] - self.ms[lo]) * (rows - lo) / (hi - lo)
        return self.ms[above[0]] if above else self.ms[below[-1]] * rows / below[-1]

    def to_json(self) -> dict:
        return {str(k): round(v, 2) for k, v in sorted(self.ms.items())}


SCORE_BINS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95)  # upper edges; the last bin runs to 1


@dataclass
class Calibration:
    """Per source, depth and score band: the share of drafted nodes greedy decoding agreed with.
    A source's own score is a prior worth `prior` nodes: the heads' joint probabilities are close
    to right, an n-gram's fixed score or a draft model's product of small probabilities are not,
    and only what was accepted tells them apart. Running counts forget slowly, since a source's
    worth changes with the file."""

    prior: float = 2.0
    keep: float = 0.98
    seen: dict[tuple, float] = field(default_factory=dict)
    accepted: dict[tuple, float] = field(default_factory=dict)

    @staticmethod
    def key(source: str, depth: int, score: float) -> tuple:
        return source, min(depth, 8), bisect_left(SCORE_BINS, score)

    def probability(self, source: str, depth: int, score: float) -> float:
        key = self.key(source, depth, score)
        return (self.accepted.get(key, 0.0) + self.prior * min(1.0, score)) / (self.seen.get(key, 0.0) + self.prior)

    def record(self, source: str, depth: int, score: float, accepted: bool) -> None:
        key = self.key(source, depth, score)
        self.seen[key] = self.keep * self.seen.get(key, 0.0) + 1.0
        self.accepted[key] = self.keep * self.accepted.get(key, 0.0) + float(accepted)


class TreeSizer:
    """Chooses the nodes of each verification pass from the measured cost of passes and the
    calibrated probability of each drafted node."""

    def __init__(self, max_rows: int = ROW_SIZES[-1], explore_every: int = 8):
        self.max_rows = max_rows
        self.cost = PassCost(tuple(s for s in ROW_SIZES if s <= max_rows))
        self.calibration = Calibration()
        # Every `explore_every`-th choice carries twice the nodes (at least 4 more): otherwise a pass
        # size once measured dear on a busy moment, or nodes whose source started out under-trusted,
        # would never be verified again and their figures never corrected (the embedded model:
        # 2.5 tokens a step without this, 3.3 with every node of up to 16 verified).
        self.explore_every = explore_every
        self.choices = 0

    def probabilities(self, tree: DraftTree) -> list[float]:
        """Each node's chance of being accepted (the root's is 1); never above its parent's."""
        p = [1.0] * len(tree)
        for node in range(1, len(tree)):
            own = self.calibration.probability(tree.sources[node], tree.depths[node], tree.scores[node])
            p[node] = min(own, p[tree.parents[node]])
        return p

    def choose(self, tree: DraftTree) -> list[int]:
        """The nodes to verify, root first, each after its parent: the most likely ones, as many as
        give the most expected tokens per millisecond."""
        p = self.probabilities(tree)
        # by probability; a parent is never less likely than its child and comes first on a tie
        order = sorted(range(1, len(tree)), key=lambda node: (-p[node], node))[: self.max_rows - 1]
        best_n, best_rate, expected = 0, 1.0 / self.cost(1), 1.0
        for n, node in enumerate(order, start=1):
            expected += p[node]
            rate = expected / self.cost(n + 1)
            if rate > best_rate:
                best_n, best_rate = n, rate
        self.choices += 1
        if self.explore_every and self.choices % self.explore_every == 0:
            best_n = max(2 * best_n, best_n + 4)
        return [0] + sorted(order[:best_n])

    def observe(self, tree: DraftTree, known: list[int], rows: int, ms: float) -> None:
        """What a pass of `rows` rows cost, and which of the drafted nodes of `tree` (all of them,
        verified or cut) greedy decoding agrees with: `known` is the greedy continuation after the
        root as far as the pass told it. A node deeper than that, under a right path, is not
        scored; a cut node is scored too, or a source the sizer stopped trusting could never
        earn its trust back."""
        self.cost.record(rows, ms)
        right = [True] * len(tree)  # whether each node's path agrees with greedy so far
        for node in range(1, len(tree)):
            depth = tree.depths[node]  # a parent comes before its children
            if depth > len(known) and right[tree.parents[node]]:
                right[node] = False
                continue  # unknown
            right[node] = right[tree.parents[node]] and depth <= len(known) and tree.tokens[node] == known[depth - 1]
            self.calibration.record(tree.sources[node], depth, tree.scores[node], right[node])

    def to_json(self) -> dict:
        return {"pass_ms": self.cost.to_json()}
