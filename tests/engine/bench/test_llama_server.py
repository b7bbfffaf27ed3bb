"""The native llama.cpp baseline: finding the build, and greedy decoding through llama-server."""

import os
import subprocess

import pytest
from memosight.engine.bench.llama_server import BUILD_SCRIPT, LlamaServerDecoder, native_bin_dir, repack_flags

from .decoding import cold_warm_short


def test_the_build_script_only_checks_when_asked_and_says_how_to_build(tmp_path):
    env = {**os.environ, "MEMOSIGHT_CACHE": str(tmp_path)}
    run = subprocess.run(["bash", str(BUILD_SCRIPT), "--check"], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    assert "not built for this CPU" in run.stderr and "build_llama_cpp.sh" in run.stderr
    assert list(tmp_path.iterdir()) == []  # --check builds and downloads nothing


def test_a_named_llama_server_binary_wins(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv("MEMOSIGHT_LLAMA_SERVER", str(binary))
    assert native_bin_dir() == tmp_path
    monkeypatch.setenv("MEMOSIGHT_LLAMA_SERVER", str(tmp_path / "missing"))
    assert native_bin_dir() is None


def test_llama_server_decodes_greedily_from_a_cached_prompt(embedded_gguf):
    bin_dir = native_bin_dir()
    if bin_dir is None:
        pytest.skip("llama.cpp is not built natively here (engine/bench/build_llama_cpp.sh)")
    from memosight.engine import load_engine

    engine = load_engine()  # the embedded model, whose GGUF export llama-server runs
    ids = engine.prompt_ids("def fibonacci(n):\n    if n < 2:\n        return n\n    return", "")
    decoder = LlamaServerDecoder(embedded_gguf, threads=1, bin_dir=bin_dir)
    cold, warm, short = cold_warm_short(decoder, ids, 12, engine.eos_ids)
    assert decoder.server.process.poll() is not None  # stopped
    assert 0 < len(cold) <= 12 and warm == cold and short == cold[:3]
    # greedy on the same weights: mostly the in-process engine's tokens too (Q8/F16 export rounding aside)
    ours = engine.generate(ids, 12, speculative=False)
    assert sum(a == b for a, b in zip(ours, cold)) >= len(cold) // 2


def test_llama_server_starts_without_repacked_weights_on_a_cpu_with_amx():
    # llama.cpp 0c1e570's AMX repacking segfaults at the first decode on a 4th-gen Xeon
    assert repack_flags(frozenset({"avx512f", "amx_tile", "amx_int8"})) == ["--no-repack"]
    assert repack_flags(frozenset({"avx2", "avx512f", "avx512_vnni"})) == []
