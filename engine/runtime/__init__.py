"""What runs the target model's forward over a token tree and keeps its KV cache: a runtime.

The speculation (speculate.py: the drafts, the tree, the acceptance rule) is written once against
this small interface; two runtimes implement it:

- `TorchRuntime` (torch_runtime.py): transformers on any device; the GPU, training, and the bit-exact
  Python API in float32;
- `LlamaCppRuntime` (llamacpp.py): llama.cpp's kernels through llama-cpp-python's low-level API, on
  a GGUF file as it is (no float32 copy); a whole tree in one `llama_decode`, each branch its own
  sequence of a unified KV cache.

A runtime holds one prompt's cache (`tokens`: the ids it holds, in order) and answers:

    prefill_hidden(ids, cancel) the cache brought to exactly `ids` (the longest cached prefix kept);
                               the last position's (hidden, logits); Interrupted if `cancel` stops it
    append(token)              one more token: its (hidden, logits)
    warm(ids, cancel, chunk)   `ids` computed ahead of a request, `chunk` tokens a pass
    verify(tree, batch_rows)   one pass over a draft tree after the cache: a Verified (each node's
                               hidden state, its logits on demand)
    commit(verified, path)     keep the accepted path's entries (and its tokens), drop the rest
    pass_ms(rows)              what a verification pass of `rows` nodes costs here, measured
    output_batch_rows()        rows of the output layer that cost about one row's time

Logits and hidden states are arrays of the runtime's own kind (torch tensors, numpy arrays):
`greedy` and `confidence` below read either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..decoding.verify import DraftTree, accept_longest_path
from ..protocol import EngineError


class Interrupted(EngineError):
    """A prompt's prefill stopped part way because its request was cancelled (llama.cpp's decode
    aborts at its next node); the cache keeps what was computed before the stop."""


def greedy(logits) -> int:
    """The greedy choice (torch and numpy alike)."""
    return int(logits.argmax())


def confidence(logits) -> float:
    """The probability the model gives its greedy choice: 1 / sum(exp(l - max))."""
    shifted = logits - logits.max()
    total = shifted.exp().sum() if hasattr(shifted, "exp") else _np_exp_sum(shifted)
    return 1.0 / float(total) if math.isfinite(float(total)) else 0.0


def _np_exp_sum(values) -> float:
    import numpy as np

    return float(np.exp(values.astype("float64")).sum())


@dataclass
class Verified:
    """One verification pass over a draft tree: each node's last hidden state, and its logits,
    computed on demand by `logits_of` (a torch runtime's output layer runs only for the nodes the
    accepted path reaches) or read from the pass (llama.cpp computes them in the pass)."""

    tree: DraftTree
    hidden: Any  # (N, H): the hidden state after each node
    logits_of: Callable[[int], Any]  # node -> its logits (cached here)
    past: int  # cached positions before the tree
    branches: dict[int, int] = field(default_factory=dict)  # llama.cpp: leaf -> the sequence of its branch
    # the static-cache runtime: every node's greedy token and the accepted path's deepest node, found
    # on the device and copied to the host at once (static_cache.py)
    greedy_ids: list[int] | None = None
    deepest: int | None = None
    _logits: dict[int, Any] = field(default_factory=dict)

    def logits(self, node: int):
        if node not in self._logits:
            self._logits[node] = self.logits_of(node)
        return self._logits[node]

    def greedy_next(self, node: int) -> int:
        """The base model's greedy choice after `node` (models with a final logit scale or soft-cap
        apply a monotonic function, which leaves the argmax unchanged)."""
        if self.greedy_ids is not None:
            return self.greedy_ids[node]
        return greedy(self.logits(node))

    def accepted_path(self) -> list[int]:
        """The nodes of the longest path greedy decoding agrees with, the root first."""
        if self.deepest is None:
            return accept_longest_path(self.tree, self.greedy_next)
        path = [self.deepest]
        while self.tree.parents[path[-1]] >= 0:
            path.append(self.tree.parents[path[-1]])
        return path[::-1]


class Runtime(Protocol):
    name: str  # "torch" or "llamacpp"
    max_branches: int  # branches a verification pass may carry (1: chains only)
    tokens: list[int]
    reused_tokens: int
    last_lookup_ms: float
    last_prefill_ms: float

    def prefill_hidden(self, input_ids: list[int], cancel=None) -> tuple[Any, Any]: ...

    def append(self, token: int) -> tuple[Any, Any]: ...

    def warm(self, input_ids: list[int], cancel, chunk: int = 64) -> int: ...

    def verify(self, tree: DraftTree, batch_rows: int = 1) -> Verified: ...

    def commit(self, verified: Verified, path: list[int]) -> None: ...

    def pass_ms(self, rows: int) -> float: ...

    def output_batch_rows(self) -> int: ...

    def steps(self, tokens: Iterator[int]) -> Iterator[int]:
        """A decoding loop's iterator, each step run the way this runtime needs (torch: inference
        mode, entered around each step: a generator's caller must not run in it)."""


class OnePromptCache:
    """What the engine asks a prompt cache, for a runtime that keeps one prompt's cells (llama.cpp's
    sequence 0, the static cache): the last rendered prompt, and nothing more to store or size."""

    _rendered: tuple[tuple, Any] | None = None
    _ready: tuple[list[int], Any, Any] | None = None  # a warm-up's whole prompt, its (hidden, logits)

    def _warmed(self, input_ids: list[int], started: float):
        """The (hidden, logits) a warm-up left for exactly this prompt, taken; None where there are none."""
        ready, self._ready = self._ready, None
        if ready is None or not (ready[0] == input_ids == self.tokens):
            return None
        self.reused_tokens += len(input_ids)
        self.last_lookup_ms, self.last_prefill_ms = (time.perf_counter() - started) * 1000, 0.0
        return ready[1], ready[2]

    def rendered(self, key: tuple):
        return self._rendered[1] if self._rendered is not None and self._rendered[0] == key else None

    def remember_rendered(self, key: tuple, prompt) -> None:
        self._rendered = (key, prompt)

    def remember(self) -> None:
        """One prompt is kept: nothing more to store."""

    def set_max_bytes(self, max_bytes: int) -> None:
        """The cache is sized once, at load, for the context."""

    def forget_all(self) -> None:
        self.clear()

    def clear(self) -> None:
        raise NotImplementedError

