"""Where a completion's milliseconds go: one request's stages, and running percentiles per stage.

A request's clock starts when its message has been read off the wire and stops when its answer has
been written back. Each `mark(stage)` gives the time since the previous mark to that stage, so the
stages always add up to the whole. The stages, in order:

  queue       message read -> its handler starts (JSON parse, params checks, the event loop)
  handler     the handler: config check, cursor offset, typing-through, supersede
  engine_wait handed to the engine thread -> it starts (a running warm-up chunk or generation)
  workspace   picking workspace files that define names used near the cursor
  context     the compressed context (regions, scores, packing)
  render ... finish   the engine's own stages (Completion.stages_ms): prompt render, KV lookup,
              prefill, decode, stop rules, bookkeeping
  engine      whatever the engine did not account for
  post        post-processing of the text
  resume      engine thread -> event loop -> the response is built
  reply       serialised and written
  joined      a request that waited for a generation another request had started
"""

from __future__ import annotations

import time
from collections import deque

ORDER = ("queue", "handler", "engine_wait", "workspace", "context", "render", "kv_lookup", "prefill",
         "decode", "stop_rule", "finish", "engine", "post", "resume", "reply", "joined")


class Timeline:
    """One request's stages in ms, as they happen (marks may come from different threads, one at a
    time)."""

    def __init__(self, started: float | None = None):
        self.started = time.perf_counter() if started is None else started
        self._last = self.started
        self.stages: dict[str, float] = {}
        self.steps: list[tuple[int, int, float, float]] = []  # the engine's decoding steps
        self.kind = "generated"  # or "typed_through", "joined", "empty", "cancelled"
        self.ended: float | None = None

    def mark(self, stage: str) -> None:
        """The time since the last mark was spent in `stage`."""
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + (now - self._last) * 1000
        self._last = now

    def split(self, parts: dict[str, float], rest: str) -> None:
        """The time since the last mark was spent in `parts` (ms, as measured inside it), and what
        they do not account for in `rest`."""
        now = time.perf_counter()
        elapsed = (now - self._last) * 1000
        for stage, ms in parts.items():
            self.stages[stage] = self.stages.get(stage, 0.0) + ms
        self.stages[rest] = self.stages.get(rest, 0.0) + max(0.0, elapsed - sum(parts.values()))
        self._last = now

    def end(self) -> None:
        self.ended = self._last

    @property
    def total_ms(self) -> float:
        return ((self.ended if self.ended is not None else self._last) - self.started) * 1000

    def to_json(self) -> dict:
        stages = {s: round(self.stages[s], 3) for s in ORDER if s in self.stages}
        stages.update({s: round(ms, 3) for s, ms in self.stages.items() if s not in stages})
        return {"kind": self.kind, "total_ms": round(self.total_ms, 3), "stages_ms": stages,
                "steps": [list(step) for step in self.steps]}

    def log_line(self) -> str:
        parts = " ".join(f"{s} {ms:.1f}" for s, ms in self.to_json()["stages_ms"].items())
        steps = " ".join(f"{d}/{a}:{ms:.1f}" for d, a, _, ms in self.steps)
        return f"{self.kind} {self.total_ms:.1f} ms: {parts}" + (f"; steps drafted/accepted:ms {steps}" if steps else "")


class StageStats:
    """Running p50/p95 per stage over the last requests, and the last requests' timelines (for
    `memosight bench replay --breakdown`, which matches them to its own clock by request id)."""

    def __init__(self, keep: int = 500, recent: int = 2000):
        self.keep = keep
        self.per_stage: dict[str, deque[float]] = {}
        self.totals: deque[float] = deque(maxlen=keep)
        self.recent: deque[dict] = deque(maxlen=recent)

    def add(self, timeline: Timeline, request_id=None) -> None:
        self.totals.append(timeline.total_ms)
        for stage in set(ORDER) | set(timeline.stages):
            # a stage a request never reached counts as 0 for it, so the percentiles are per request
            self.per_stage.setdefault(stage, deque(maxlen=self.keep)).append(timeline.stages.get(stage, 0.0))
        self.recent.append({"id": request_id, **timeline.to_json()})

    def to_json(self, recent: bool = False) -> dict:
        def pct(values, q):
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3) if ordered else None

        stages = {s: {"p50": pct(v, 0.5), "p95": pct(v, 0.95), "mean": round(sum(v) / len(v), 3)}
                  for s, v in sorted(self.per_stage.items(), key=lambda kv: _order(kv[0])) if any(v)}
        out = {"requests": len(self.totals), "total_ms": {"p50": pct(self.totals, 0.5), "p95": pct(self.totals, 0.95)},
               "stages_ms": stages}
        if recent:
            out["recent"] = list(self.recent)
        return out


def _order(stage: str) -> int:
    return ORDER.index(stage) if stage in ORDER else len(ORDER)
