"""The CPU at hand, as every figure must name it: model, torch's kernel level, oneDNN's, threads.

A figure holds for the CPU it was taken on. The same code ran int8 30% off its float layer on an AMD
EPYC with AVX2 only and right on a Xeon with AMX, and bfloat16 is fast only where the CPU multiplies
it natively (AMX, AVX-512-BF16). Both kernel libraries can be capped below the real CPU, which is
how an AMX machine reproduces an AVX2 laptop: ATEN_CPU_CAPABILITY=avx2 for torch's own kernels,
ONEDNN_MAX_CPU_ISA=AVX2 for oneDNN's (linear layers, int8). The description reads both caps.
torch is imported only when it is described, so that the server's commands can name the CPU cheaply.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from dataclasses import dataclass

# oneDNN's instruction-set levels, lowest first, each with the /proc/cpuinfo flags it needs.
ONEDNN_LEVELS = (
    ("SSE41", {"sse4_1"}),
    ("AVX", {"avx"}),
    ("AVX2", {"avx2"}),
    ("AVX2_VNNI", {"avx2", "avx_vnni"}),
    ("AVX512_CORE", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("AVX512_CORE_VNNI", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}),
    ("AVX512_CORE_BF16", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}),
    ("AVX512_CORE_AMX", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                         "amx_tile", "amx_int8", "amx_bf16"}),
)
_LEVEL_NAMES = [name for name, _ in ONEDNN_LEVELS]
# ONEDNN_MAX_CPU_ISA also takes names between ours; each maps to the highest of ours it allows
_CAP_ALIASES = {"AVX512_CORE_FP16": "AVX512_CORE_BF16", "AVX10_1_512": "AVX512_CORE_BF16",
                "AVX2_VNNI_2": "AVX2_VNNI", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                "AVX512_CORE_AMX_FP16": "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX"}


@dataclass(frozen=True)
class CpuInfo:
    model_name: str  # what /proc/cpuinfo (or the platform) calls the processor
    capability: str  # torch's ATen kernel level: DEFAULT, AVX2, AVX512 (ATEN_CPU_CAPABILITY caps it)
    onednn_isa: str  # oneDNN's level from the CPU's flags, capped by ONEDNN_MAX_CPU_ISA
    threads: int  # torch's intra-op threads now
    cores: int  # logical CPUs the OS reports

    @property
    def native_bfloat16(self) -> bool:
        """Whether oneDNN multiplies bfloat16 natively here (AMX or AVX-512-BF16); elsewhere it
        converts to float32 around every product and runs slower than float32 itself."""
        return self.onednn_isa in _LEVEL_NAMES and \
            _LEVEL_NAMES.index(self.onednn_isa) >= _LEVEL_NAMES.index("AVX512_CORE_BF16")

    @property
    def key(self) -> str:
        """Names this CPU, its caps and torch's version for per-machine caches (threads left out)."""
        import torch

        text = "|".join((self.model_name, self.capability, self.onednn_isa, torch.__version__))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"model_name": self.model_name, "capability": self.capability, "onednn_isa": self.onednn_isa,
                "threads": self.threads, "cores": self.cores}

    def __str__(self) -> str:
        return (f"{self.model_name} (torch {self.capability}, oneDNN {self.onednn_isa}, "
                f"{self.threads} of {self.cores} threads)")


def cpu_info(threads: int | None = None) -> CpuInfo:
    """This CPU now (the thread count is read at each call; the rest once). `threads`: those of a
    runtime that is not torch's (llama.cpp), whose process need not import torch to say so."""
    model_name, flags = _cpuinfo()
    if threads is not None and "torch" not in sys.modules:
        return CpuInfo(model_name, "-", onednn_isa(flags, os.environ), threads, os.cpu_count() or 1)
    import torch

    return CpuInfo(model_name, _torch_capability(), onednn_isa(flags, os.environ),
                   torch.get_num_threads() if threads is None else threads, os.cpu_count() or 1)


def onednn_isa(flags: frozenset[str], environ) -> str:
    """oneDNN's level: the highest the CPU's flags allow, capped by ONEDNN_MAX_CPU_ISA (or its
    older name DNNL_MAX_CPU_ISA) as oneDNN itself reads it."""
    level = "DEFAULT"
    for name, needs in ONEDNN_LEVELS:
        if needs <= flags:
            level = name
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    cap = _CAP_ALIASES.get(cap, cap)
    if cap in _LEVEL_NAMES and (level == "DEFAULT" or _LEVEL_NAMES.index(cap) < _LEVEL_NAMES.index(level)):
        return cap
    return level


def cpu_model_and_flags() -> str:
    """A short key of the CPU's model name and instruction-set flags (no torch needed)."""
    model_name, flags = _cpuinfo()
    return f"{model_name}:{hashlib.sha256(' '.join(sorted(flags)).encode()).hexdigest()[:12]}"


def has_amx(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU multiplies on AMX tiles (a 4th-gen Xeon and later)."""
    return "amx_tile" in (_cpuinfo()[1] if flags is None else flags)


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return platform.processor() or platform.machine() or "unknown", frozenset()
    model_name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model_name:
            model_name = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model_name and flags:
            break
    return model_name or platform.machine() or "unknown", flags


@functools.cache
def _torch_capability() -> str:
    import torch

    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return "unknown"
