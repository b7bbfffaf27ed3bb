"""`dtype = "auto"` on a CPU: float32, bfloat16 or int8, chosen by measuring this model here, once.

No one dtype is best on every CPU. On a Xeon with AMX, bfloat16 prefilled Qwen2.5-Coder-0.5B 3.6x
faster than float32; on an AMD EPYC with AVX2 only it has no fast path and runs slower than float32.
int8 reads a quarter of the bytes, but its quantize/dequantize per layer costs more than that saves
for a small model. So at load, on a CPU:
- candidates: float32 always; bfloat16 only where the CPU multiplies it natively (AMX or
  AVX-512-BF16: hardware.CpuInfo.native_bfloat16); int8 always;
- right: a candidate's greedy next token agrees with float32's on at least 98% of the positions of
  a probe of real code (the standard library's `textwrap`, which no model here was tuned on);
- faster: a keystroke's work (a 32-token prefill after 96 cached tokens, then 8 one-token steps)
  takes at least 10% less time than in float32, best of 3 (a smaller win is inside the noise);
- the fastest right candidate wins, float32 otherwise. The choice is written to
  `dtype-choices.json` in the cache folder under the CPU, torch's version and the model, so the
  next load reads it instead of measuring.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import textwrap
import time
from dataclasses import dataclass, field

import torch

from ..decoding import kv
from ..runtime import lean
from . import measured
from .files import cache_root
from .hardware import cpu_info
from .int8 import calibration_ids, quantize_int8
from .memory import give_back

log = logging.getLogger(__name__)

METHOD = "2"  # changes when the candidates or how they compute change: older choices are measured again
MAX_CACHED = 64  # choices kept in the cache file, the oldest dropped first (test models come and go)
CANDIDATES = ("float32", "bfloat16", "int8")
MIN_AGREEMENT = 0.98  # next-token agreement with float32 a candidate needs on the probe
MIN_SPEEDUP = 1.10  # how much faster than float32 a candidate must be to be chosen
PROBE_TOKENS = 256  # the probe's length for agreement; timing uses its first CACHED + PREFILL + STEPS
CACHED, PREFILL, STEPS = 96, 32, 8  # a keystroke: PREFILL new tokens after CACHED, then STEPS steps


@dataclass
class DtypeChoice:
    dtype: str  # "float32", "bfloat16" or "int8"
    keystroke_ms: dict[str, float] = field(default_factory=dict)  # per candidate measured
    agreement: dict[str, float] = field(default_factory=dict)  # next-token agreement with float32
    cpu: dict = field(default_factory=dict)  # hardware.CpuInfo.to_json() when measured
    cached: bool = False  # read from the per-machine cache, not measured now

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "keystroke_ms": self.keystroke_ms, "agreement": self.agreement,
                "cpu": self.cpu, "cached": self.cached}


def choose_cpu_dtype(model, tokenizer, model_key: str) -> DtypeChoice:
    """The dtype `model` (loaded in float32) should run in on this CPU; reads or fills the cache."""
    cpu = cpu_info()
    key = f"{cpu.key}|{METHOD}|{model_key}"
    path = cache_root() / "dtype-choices.json"
    entry = measured.read(path).get(key)
    if isinstance(entry, dict) and entry.get("dtype") in CANDIDATES:  # a hand-edited entry is measured over
        try:
            return DtypeChoice(**{**entry, "cached": True})
        except TypeError:
            pass
    choice = measure(model, tokenizer, native_bfloat16=cpu.native_bfloat16)
    choice.cpu = cpu.to_json()
    measured.remember(path, key, {k: v for k, v in choice.to_json().items() if k != "cached"}, MAX_CACHED)
    log.info("dtype auto on %s: %s (keystroke ms %s, agreement %s)", cpu, choice.dtype, choice.keystroke_ms,
             choice.agreement)
    return choice


@torch.inference_mode()
def measure(model, tokenizer, native_bfloat16: bool) -> DtypeChoice:
    try:
        ids = probe_ids(tokenizer)
    except (OSError, TypeError):  # a Python without its library's sources: nothing to measure on
        log.warning("dtype auto: no probe text (the standard library's sources are missing); float32")
        return DtypeChoice("float32")
    reference = _next_tokens(model, ids)
    choice = DtypeChoice("float32", keystroke_ms={"float32": _keystroke_ms(model, ids)})
    candidates = ["int8"] + (["bfloat16"] if native_bfloat16 else [])
    # Memory: the float32 decoder's packed copies go while candidates are measured beside it (built
    # again on its next use), and each candidate's pieces go back to the system before the next.
    lean.forget(model)
    give_back()
    for name in candidates:
        candidate = _candidate(model, name, tokenizer)
        choice.agreement[name] = round(float((_next_tokens(candidate, ids) == reference).float().mean()), 4)
        if choice.agreement[name] >= MIN_AGREEMENT:
            choice.keystroke_ms[name] = _keystroke_ms(candidate, ids)
        del candidate
        give_back()
    best = min(choice.keystroke_ms, key=choice.keystroke_ms.get)
    if choice.keystroke_ms[best] * MIN_SPEEDUP <= choice.keystroke_ms["float32"]:
        choice.dtype = best
    return choice


def as_dtype(model, dtype: str, tokenizer):
    """`model` (float32) turned into `dtype`, in place (int8 calibrated on `tokenizer`'s ids). The
    lean decoder built while measuring goes first: it holds float32 copies of the weights."""
    if dtype != "float32":
        lean.forget(model)
    if dtype == "int8":
        return quantize_int8(model, calibration=calibration_ids(tokenizer))
    if dtype == "bfloat16":
        return model.to(torch.bfloat16)
    return model


def _candidate(model, dtype: str, tokenizer):
    """`model` as `dtype` beside it, costing only what differs: the copy shares the float32 model's
    parameters, and only its converted weights are new (int8: a quarter of the linear layers' bytes;
    bfloat16: half of every weight). A whole float32 copy per candidate took Qwen2.5-Coder-0.5B's
    first load past twice the loaded engine's memory (issue 41)."""
    if dtype == "int8":  # new layers replace the copy's linear ones; the float weights stay shared, unchanged
        shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
        return quantize_int8(copy.deepcopy(model, shared), calibration=calibration_ids(tokenizer))
    if dtype == "bfloat16":  # each parameter converted once, straight into the copy
        converted = {id(p): torch.nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=False)
                     for p in model.parameters()}
        return copy.deepcopy(model, converted).to(torch.bfloat16)  # and its buffers, as as_dtype does
    return model


def probe_ids(tokenizer) -> list[int]:
    """PROBE_TOKENS tokens of real code, the same on every machine."""
    text = inspect.getsource(textwrap)[:4_000]  # enough for PROBE_TOKENS, short of any length warning
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[:PROBE_TOKENS]


def _next_tokens(model, ids: list[int], rows: int = 64) -> torch.Tensor:
    """The greedy next token at each position; the output layer a few rows at a time (a large
    vocabulary's logits for the whole probe would be the load's largest temporary)."""
    hidden = model.base_model(torch.tensor([ids])).last_hidden_state[0]
    head = model.get_output_embeddings()
    return torch.cat([head(hidden[i:i + rows]).float().argmax(dim=-1) for i in range(0, len(hidden), rows)])


def _keystroke_ms(model, ids: list[int]) -> float:
    """Best of 3: a PREFILL-token pass on CACHED cached tokens, then STEPS one-token steps, through
    the engine's own forward (kv.forward_hidden) and the output layer for the last position."""
    head = model.get_output_embeddings()
    best = float("inf")
    for _ in range(3):
        cache = kv.new_cache(model)
        kv.forward_hidden(model, torch.tensor([ids[:CACHED]]), cache)
        start = time.perf_counter()
        hidden = kv.forward_hidden(model, torch.tensor([ids[CACHED:CACHED + PREFILL]]), cache)
        head(hidden[:, -1:])
        for token in ids[CACHED + PREFILL:CACHED + PREFILL + STEPS]:
            head(kv.forward_hidden(model, torch.tensor([[token]]), cache))
        best = min(best, (time.perf_counter() - start) * 1000)
    return round(best, 3)
