"""The static-cache runtime gives the dynamic path's tokens on a CPU in float32 (its own passes, and
the passes CUDA graphs capture, run eagerly); acceptance on the device equals the host's; the
graphs themselves run only where CUDA is (skipped, never faked, without it)."""

import random
import threading

import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.decoding.verify import DraftTree, accept_longest_path
from memosight.engine.runtime import Interrupted
from memosight.engine.runtime.static_cache import SIZES, StaticRuntime, accept_on_device, mode_for

from ..decoding.test_speculate import PROMPTS, with_random_heads


def _engines(path, monkeypatch, mode: str):
    dynamic = load_engine(str(path), device="cpu")
    monkeypatch.setenv("MEMOSIGHT_STATIC", mode)
    static = load_engine(str(path), device="cpu")
    assert isinstance(static.runtime, StaticRuntime) and static.runtime.graphs == mode
    return dynamic, static


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["off", "eager"])
def test_static_cells_give_the_dynamic_paths_tokens_in_float32(tiny_models, monkeypatch, arch, mode):
    dynamic, static = _engines(tiny_models[arch], monkeypatch, mode)
    with_random_heads(static)  # trees with branches: accepted paths that leave the first chain move cells
    for prompt in PROMPTS:
        ids = dynamic.prompt_ids(prompt, "\n    return total\n")
        for limit in (1, 5, 40):
            plain = dynamic.generate(ids, limit, speculative=False)
            assert static.generate(ids, limit, speculative=False) == plain, (prompt, limit)
            assert static.generate(ids, limit, speculative=True) == plain, (prompt, limit)
    stats = static.speculator.to_json()
    assert stats["sources"]["heads"]["drafted"] > 0 and stats["tokens_per_step"] > 1


def test_off_mode_is_bit_for_bit_the_dynamic_path(tiny_models, monkeypatch):
    dynamic, static = _engines(tiny_models["llama"], monkeypatch, "off")
    ids = dynamic.prompt_ids(PROMPTS[1], "")
    with torch.inference_mode():
        for engine in (dynamic, static):
            engine.prompt_cache.clear()
        (_, a), (_, b) = dynamic.runtime.prefill_hidden(ids), static.runtime.prefill_hidden(ids)
        assert torch.equal(a, b)
        for token in (5, 9, 11):
            assert torch.equal(dynamic.runtime.append(token)[1], static.runtime.append(token)[1])


def test_a_prompt_reuses_the_cells_it_shares_with_the_last_and_a_cancel_keeps_whole_chunks(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    runtime = StaticRuntime(model, graphs="eager")
    ids = [(7 * i + 3) % 300 + 5 for i in range(1200)]
    runtime.prefill_hidden(ids[:100])
    runtime.prefill_hidden(ids[:90] + [1, 2, 3])
    assert runtime.reused_tokens == 90 and runtime.tokens == ids[:90] + [1, 2, 3]
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Interrupted):
        runtime.prefill_hidden(ids, cancel)
    assert runtime.tokens == ids[:90]  # nothing new went in, what was shared stays
    with pytest.raises(Exception, match="context"):
        runtime.prefill_hidden(list(range(5, 305)) * 20)


def _random_tree(rng: random.Random, nodes: int, vocab: int) -> DraftTree:
    tree = DraftTree()
    tree.add(rng.randrange(vocab), -1, "greedy")
    while len(tree) < nodes:
        parent = rng.randrange(len(tree))
        token = rng.randrange(vocab)
        if token not in tree.children[parent]:
            tree.add(token, parent, "random")
    return tree


def test_acceptance_on_the_device_equals_the_hosts_on_random_trees():
    rng = random.Random(0)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5])  # few tokens: long accepted paths, ties of depth across branches
        n = rng.randint(1, 40)
        size = next(s for s in SIZES if s >= n)
        tree = _random_tree(rng, n, vocab)
        greedy = [rng.randrange(vocab) for _ in range(n)]
        visible = torch.eye(size, dtype=torch.bool)
        for node, parent in enumerate(tree.parents):
            if parent >= 0:
                visible[node] |= visible[parent]
        pad = size - n
        deepest = accept_on_device(torch.tensor(tree.tokens + [0] * pad), torch.tensor(tree.parents + [-1] * pad),
                                   visible, torch.tensor(tree.depths + [0] * pad),
                                   torch.tensor(greedy + [0] * pad), torch.arange(size) < n)
        path = accept_longest_path(tree, greedy)
        assert int(deepest) == path[-1]


def test_the_dynamic_path_stays_on_a_cpu_by_default_and_a_bad_mode_is_named(tiny_model_dir, monkeypatch):
    from memosight.engine.protocol import EngineError
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert mode_for(model) is None
    monkeypatch.setenv("MEMOSIGHT_STATIC", "fast")
    with pytest.raises(EngineError, match="MEMOSIGHT_STATIC"):
        mode_for(model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_give_the_dynamic_paths_tokens(tiny_models):
    cpu = load_engine(str(tiny_models["llama"]), device="cpu")
    gpu = with_random_heads(load_engine(str(tiny_models["llama"]), device="cuda", dtype="float32"))
    assert isinstance(gpu.runtime, StaticRuntime) and gpu.runtime.graphs == "cuda"
    assert sorted(gpu.runtime.passes) == list(SIZES)  # captured at load
    for prompt in PROMPTS:
        ids = cpu.prompt_ids(prompt, "")
        plain = gpu.generate(ids, 40, speculative=False)
        assert gpu.generate(ids, 40, speculative=True) == plain
        assert len(plain) == len(cpu.generate(ids, 40, speculative=False))
