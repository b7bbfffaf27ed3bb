"""An engine that misbehaves on purpose: for the soak benchmark and the server's fault tests.

`FaultyEngine` wraps any Engine and, by a seeded plan, makes some streams raise in the middle of a
generation and some start late, without touching the wrapped engine's internals: faults enter
through the engine protocol, exactly where a real engine's failures (a CUDA error, an HTTP
disconnect, a slow GPU) would. `python -m memosight.server.with_faults --faults SPEC` (a test-only
entry point) puts it in front of the engine the settings load; `status()` counts what was injected.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Generator
from dataclasses import dataclass

from ..protocol import Completion, CompletionRequest, Engine, EngineSettings, Stream


class InjectedFault(RuntimeError):
    """Raised by FaultyEngine in the middle of a generation."""


@dataclass(frozen=True)
class FaultPlan:
    raise_rate: float = 0.0  # share of streams that raise after `raise_after` pieces
    slow_rate: float = 0.0  # share of streams that wait `slow_ms` before their first piece
    slow_ms: float = 500.0
    raise_after: int = 1  # pieces yielded before the fault (0: raise before the first)
    seed: int = 0

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        """'raise=0.05,slow=0.05,slow_ms=400,raise_after=1,seed=3' (any subset, any order)."""
        names = {"raise": "raise_rate", "slow": "slow_rate", "slow_ms": "slow_ms", "raise_after": "raise_after",
                 "seed": "seed"}
        values: dict[str, float | int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in names:
                raise ValueError(f"bad fault spec {part!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"bad fault spec {part!r}: {value!r} is not a number") from None
            field = names[key]
            values[field] = int(number) if field in ("raise_after", "seed") else number
        plan = cls(**values)
        if not (0 <= plan.raise_rate <= 1 and 0 <= plan.slow_rate <= 1 and plan.slow_ms >= 0 and plan.raise_after >= 0):
            raise ValueError(f"bad fault spec {spec!r}: rates lie in [0, 1], times and counts are >= 0")
        return plan


class FaultyEngine:
    """Engine protocol: everything goes to `inner`, except the faults the plan asks for."""

    def __init__(self, inner: Engine, plan: FaultPlan):
        self.inner = inner
        self.plan = plan
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self.raised = 0
        self.slowed = 0
        self.streams = 0

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def stream(self, request: CompletionRequest) -> Stream:
        with self._lock:
            self.streams += 1
            fail = self._rng.random() < self.plan.raise_rate
            slow = not fail and self._rng.random() < self.plan.slow_rate
        return Stream(self._pieces(request, fail, slow))

    def _pieces(self, request: CompletionRequest, fail: bool, slow: bool) -> Generator[str, None, Completion]:
        if slow:
            with self._lock:
                self.slowed += 1
            request.cancel.wait(self.plan.slow_ms / 1000)  # a slow engine still honours a cancel
        inner = self.inner.stream(request)
        try:
            for n, piece in enumerate(inner):
                if fail and n >= self.plan.raise_after:
                    break
                yield piece
            if fail:
                with self._lock:
                    self.raised += 1
                raise InjectedFault(f"injected fault (stream {self.streams}): the engine failed mid-generation")
        finally:
            inner.close()
        return inner.result()

    def info(self):
        return self.inner.info()

    def status(self) -> dict:
        out = dict(self.inner.status())
        out["faults"] = {"raised": self.raised, "slowed": self.slowed, "streams": self.streams}
        return out

    def prefill(self, request: CompletionRequest) -> None:
        self.inner.prefill(request)

    def refresh(self, cancel):
        return self.inner.refresh(cancel)

    def configure(self, settings: EngineSettings) -> None:
        self.inner.configure(settings)

    def close(self) -> None:
        self.inner.close()
