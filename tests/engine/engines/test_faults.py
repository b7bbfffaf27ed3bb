"""The fault-injecting engine: faults enter through the engine protocol, the inner engine is left
clean (its stream closed), a cancel cuts a stall short, and a plan with no faults changes nothing."""

from __future__ import annotations

import threading
import time

import pytest
from memosight.engine.engines.faults import FaultPlan, FaultyEngine, InjectedFault
from memosight.engine.protocol import Completion, CompletionRequest, EngineInfo, EngineSettings, Stream


class Pieces:
    """An engine that writes its pieces one by one and records what happened to its streams."""

    def __init__(self, pieces=("a", "b", "c")):
        self.pieces = pieces
        self.closed_streams = 0
        self.prefills, self.settings = [], []

    def count_tokens(self, text: str) -> int:
        return len(text)

    def stream(self, request: CompletionRequest) -> Stream:
        def gen():
            try:
                for piece in self.pieces:
                    yield piece
            finally:
                self.closed_streams += 1
            return Completion("".join(self.pieces), len(self.pieces), 0, 1.0, 1.0, "eos")
        return Stream(gen())

    def info(self) -> EngineInfo:
        return EngineInfo("pieces", "cpu", "float32", has_fim=False)

    def status(self) -> dict:
        return {"model": "pieces"}

    def prefill(self, request: CompletionRequest) -> None:
        self.prefills.append(request)

    def refresh(self, cancel) -> None:
        return None

    def configure(self, settings: EngineSettings) -> None:
        self.settings.append(settings)

    def close(self) -> None:
        pass


def test_no_faults_pass_everything_through():
    inner = Pieces()
    engine = FaultyEngine(inner, FaultPlan())
    stream = engine.stream(CompletionRequest("x"))
    assert list(stream) == ["a", "b", "c"] and stream.result().text == "abc"
    engine.prefill(CompletionRequest("y"))
    engine.configure(EngineSettings(speculative=False))
    assert len(inner.prefills) == 1 and inner.settings == [EngineSettings(speculative=False)]
    assert engine.status() == {"model": "pieces", "faults": {"raised": 0, "slowed": 0, "streams": 1}}


def test_a_fault_raises_mid_generation_and_closes_the_inner_stream():
    inner = Pieces()
    engine = FaultyEngine(inner, FaultPlan(raise_rate=1.0, raise_after=2))
    got = []
    with pytest.raises(InjectedFault, match="mid-generation"):
        for piece in engine.stream(CompletionRequest("x")):
            got.append(piece)
    assert got == ["a", "b"] and inner.closed_streams == 1
    assert engine.status()["faults"]["raised"] == 1


def test_a_stall_ends_at_once_when_the_request_is_cancelled():
    engine = FaultyEngine(Pieces(), FaultPlan(slow_rate=1.0, slow_ms=10_000))
    request = CompletionRequest("x")
    threading.Timer(0.05, request.cancel.set).start()
    started = time.perf_counter()
    assert engine.stream(request).result().text == "abc"
    assert time.perf_counter() - started < 5 and engine.status()["faults"]["slowed"] == 1


def test_the_plan_is_seeded():
    def outcomes(seed):
        engine = FaultyEngine(Pieces(), FaultPlan(raise_rate=0.5, seed=seed))
        out = []
        for _ in range(20):
            try:
                engine.stream(CompletionRequest("x")).result()
                out.append(True)
            except InjectedFault:
                out.append(False)
        return out
    assert outcomes(1) == outcomes(1) and False in outcomes(1) and True in outcomes(1)


def test_fault_specs_are_parsed_and_bad_ones_named():
    assert FaultPlan.parse("raise=0.1, slow=0.2,slow_ms=50,seed=3") == FaultPlan(0.1, 0.2, 50.0, 1, 3)
    for bad, words in [("raise", "KEY=VALUE"), ("boom=1", "KEY one of"), ("slow=x", "not a number"),
                       ("raise=1.5", "rates lie in")]:
        with pytest.raises(ValueError, match=words):
            FaultPlan.parse(bad)
