"""The int8 and bfloat16 tests again on an emulated AVX2 CPU, in a subprocess.

On an AMX or AVX-512 machine this is how CI meets what an AVX2 laptop would: int8 sums saturated
in int16 there (30% off), and bfloat16 has no native path. torch's kernels are capped by
ATEN_CPU_CAPABILITY=avx2 and oneDNN's by ONEDNN_MAX_CPU_ISA=AVX2; both are read at start-up, hence
the subprocess. On an AVX2 machine it runs the same tests once more.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
EMULATED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.mark.skipif(os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2", reason="already emulating AVX2")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX2 is an x86 instruction set")
def test_int8_and_bfloat16_hold_on_an_emulated_avx2_cpu():
    env = {**os.environ, **EMULATED}
    tests = [str(TESTS / "loading" / "test_int8.py"), str(TESTS / "loading" / "test_auto_dtype.py"),
             str(TESTS / "loading" / "test_hardware.py"), str(TESTS / "test_emulated_isa.py")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout


@pytest.mark.skipif(os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2", reason="runs inside the emulation only")
def test_the_emulation_took_hold():
    import torch
    from memosight.engine.loading.int8 import PACKED_KERNELS, weight_levels
    from memosight.engine.loading.hardware import cpu_info

    assert torch.backends.cpu.get_cpu_capability() == "AVX2"  # torch's kernels capped
    info = cpu_info()  # reads the cap back: the description a figure would carry
    assert info.onednn_isa in {"AVX2", "AVX", "SSE41", "DEFAULT"} and not info.native_bfloat16
    if PACKED_KERNELS:  # oneDNN's own kernels capped: they saturate int16 pairs, so weights get 7 bits
        assert weight_levels() == 63
