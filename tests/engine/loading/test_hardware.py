"""The CPU named for every figure: its oneDNN level from its flags, capped as oneDNN caps it."""

import torch
from memosight.engine.loading.hardware import ONEDNN_LEVELS, CpuInfo, cpu_info, onednn_isa

AVX2_EPYC = frozenset("fpu sse4_1 sse4_2 avx avx2 fma bmi2".split())
AMX_XEON = ONEDNN_LEVELS[-1][1] | AVX2_EPYC


def test_the_level_is_the_highest_the_flags_allow():
    assert onednn_isa(AVX2_EPYC, {}) == "AVX2"
    assert onednn_isa(AMX_XEON, {}) == "AVX512_CORE_AMX"
    assert onednn_isa(AVX2_EPYC | {"avx_vnni"}, {}) == "AVX2_VNNI"
    assert onednn_isa(frozenset(), {}) == "DEFAULT"


def test_an_emulated_isa_caps_the_level_as_onednn_does():
    assert onednn_isa(AMX_XEON, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == "AVX2"
    assert onednn_isa(AMX_XEON, {"DNNL_MAX_CPU_ISA": "avx512_core_vnni"}) == "AVX512_CORE_VNNI"
    assert onednn_isa(AMX_XEON, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"}) == "AVX512_CORE_BF16"
    # a cap above what the CPU has changes nothing; an unknown one is ignored, as oneDNN ignores it
    assert onednn_isa(AVX2_EPYC, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "AVX2"
    assert onednn_isa(AVX2_EPYC, {"ONEDNN_MAX_CPU_ISA": "ALL"}) == "AVX2"


def test_bfloat16_is_native_only_with_amx_or_avx512_bf16():
    def cpu(isa):
        return CpuInfo("x", "AVX2", isa, 1, 2)

    assert not cpu("AVX2").native_bfloat16 and not cpu("AVX512_CORE_VNNI").native_bfloat16
    assert cpu("AVX512_CORE_BF16").native_bfloat16 and cpu("AVX512_CORE_AMX").native_bfloat16
    assert not cpu("DEFAULT").native_bfloat16  # no flags to read (ARM, macOS): never a crash


def test_this_cpu_is_described_with_everything_a_figure_needs():
    info = cpu_info()
    data = info.to_json()
    assert set(data) == {"model_name", "capability", "onednn_isa", "threads", "cores"}
    assert data["threads"] == torch.get_num_threads() and data["cores"] >= 1
    assert data["capability"] == torch.backends.cpu.get_cpu_capability()
    assert info.model_name and info.onednn_isa in {"DEFAULT", *(name for name, _ in ONEDNN_LEVELS)}
    assert info.key == cpu_info().key and len(info.key) == 16
    assert info.model_name in str(info)
