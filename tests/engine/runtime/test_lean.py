import pytest
import torch
from memosight.engine.decoding import kv
from memosight.engine.decoding.verify import Candidate, build_tree, tree_attention_mask
from memosight.engine.runtime import lean
from transformers import AutoModelForCausalLM


def _hidden_states(model, ids: list[int], use_lean: bool) -> list[torch.Tensor]:
    """Hidden states of a prefill, a second prefill onto a cache, one token, and a draft tree."""
    lean.enabled = use_lean
    try:
        with torch.inference_mode():
            cache = kv.new_cache(model)
            out = [kv.forward_hidden(model, torch.tensor([ids[:20]]), cache),
                   kv.forward_hidden(model, torch.tensor([ids[20:35]]), cache),
                   kv.forward_hidden(model, torch.tensor([[ids[35]]]), cache)]
            tree = build_tree(ids[36], [Candidate(ids[37:42], "a"), Candidate([ids[37], 3, 4], "b")], 16, 16)
            past = kv.cached_length(cache)
            mask = tree_attention_mask(tree, past, torch.float32, "cpu")
            positions = torch.tensor([[past + d for d in tree.depths]])
            out.append(kv.forward_hidden(model, torch.tensor([tree.tokens]), cache, attention_mask=mask,
                                         position_ids=positions))
            return out
    finally:
        lean.enabled = True


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("packed", [False, True])
def test_lean_forward_matches_transformers(tiny_models, arch, packed, monkeypatch):
    """Bit for bit with F.linear everywhere (MEMOSIGHT_PACK=0); with several-token passes through
    packed weights, the same float32 arithmetic grouped differently: equal to float rounding."""
    monkeypatch.setattr(lean, "PACK_FLOAT32", packed and lean.PACK_FLOAT32)
    model = AutoModelForCausalLM.from_pretrained(tiny_models[arch]).eval()
    assert lean.decoder_for(model) is not None
    ids = [(7 * i + 3) % (model.config.vocab_size - 10) + 5 for i in range(50)]
    reference = _hidden_states(model, ids, use_lean=False)
    for ours, theirs in zip(_hidden_states(model, ids, use_lean=True), reference):
        assert torch.allclose(ours, theirs, atol=1e-5) if packed else torch.equal(ours, theirs)


def test_fused_projections_are_views_and_transformers_still_agrees(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"]).eval()  # q/k/v have biases
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        decoder = lean.decoder_for(model)
        after = model(input_ids=ids).logits
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == decoder.layers[0].qkv.weight.data_ptr()
    assert attn.k_proj.bias.data_ptr() > decoder.layers[0].qkv.bias.data_ptr()
    assert torch.equal(before, after)


def test_int8_projections_fuse_into_views_and_the_lean_forward_still_matches(tiny_models):
    from memosight.engine.loading.int8 import quantize_int8

    model = quantize_int8(AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"]).eval())
    ids = [(7 * i + 3) % (model.config.vocab_size - 10) + 5 for i in range(50)]
    reference = _hidden_states(model, ids, use_lean=False)
    decoder = lean.decoder_for(model)
    assert model.model.layers[0].self_attn.q_proj.qweight.data_ptr() == decoder.layers[0].qkv.qweight.data_ptr()
    for ours, theirs in zip(_hidden_states(model, ids, use_lean=True), reference):
        # the same up to attention's rounding: the lean pass does attention in float64 (below)
        torch.testing.assert_close(ours, theirs, atol=0.05, rtol=0.05)


def _one_by_one_and_together(model, ids: list[int], split: int) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        cache = kv.new_cache(model)
        kv.forward_hidden(model, torch.tensor([ids[:split]]), cache)
        together = kv.forward_hidden(model, torch.tensor([ids[split:]]), cache)
        cache = kv.new_cache(model)
        kv.forward_hidden(model, torch.tensor([ids[:split]]), cache)
        alone = torch.cat([kv.forward_hidden(model, torch.tensor([[i]]), cache) for i in ids[split:]], dim=1)
    return together, alone


def test_an_int8_tokens_hidden_state_is_the_same_alone_or_verified_with_others(tiny_models, monkeypatch):
    """What makes speculative decoding of an int8 model equal its greedy decoding: a token's result
    must not depend on how many tokens share its forward pass."""
    from memosight.engine.loading.int8 import quantize_int8

    model = quantize_int8(AutoModelForCausalLM.from_pretrained(tiny_models["llama"]).eval())
    ids = [(11 * i + 5) % (model.config.vocab_size - 10) + 5 for i in range(120)]
    decoder = lean.decoder_for(model)
    together, alone = _one_by_one_and_together(model, ids, 100)
    assert torch.equal(together, alone)
    # float32 attention: the last-bit differences between the two come through int8 rounding
    monkeypatch.setattr(decoder, "attention_dtype", None)
    together, alone = _one_by_one_and_together(model, ids, 100)
    assert not torch.equal(together, alone)


def test_unsupported_architectures_keep_the_transformers_forward(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["gpt2"]).eval()
    assert lean.decoder_for(model) is None
    with torch.inference_mode():
        hidden = kv.forward_hidden(model, torch.tensor([[5, 6, 7]]), kv.new_cache(model))
    assert hidden.shape == (1, 3, model.config.hidden_size)


def test_a_float32_projection_of_several_rows_is_the_same_arithmetic_through_packed_weights():
    from memosight.engine.runtime import lean

    if not lean.PACK_FLOAT32:
        pytest.skip("oneDNN is not available in this torch build")
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32), torch.randn(48)
    projection = lean._Projection(weight, bias)
    x = torch.randn(1, 7, 32)
    one = projection(x[:, :1])
    assert torch.equal(one, torch.nn.functional.linear(x[:, :1], weight, bias))  # one row: F.linear itself
    many = projection(x)
    assert projection.packed is not None
    assert torch.allclose(many, torch.nn.functional.linear(x, weight, bias), atol=1e-5)
    assert torch.equal(projection(x[:, 2:5]), many[:, 2:5])  # a row's result does not depend on its batch


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5])
def test_packed_copies_take_at_most_their_share_of_the_weights_output_layer_first(tiny_models, share, monkeypatch):
    if not lean.PACK_FLOAT32:
        pytest.skip("no oneDNN here: nothing is packed")
    monkeypatch.setattr(lean, "PACKED_SHARE", share)
    monkeypatch.setattr(lean, "_packing_pays", lambda projection: True)  # this CPU's timing aside
    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"]).eval()
    decoder = lean.LeanDecoder(model)
    projections = [decoder.output] + [p for layer in decoder.layers
                                      for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)]
    packed = [p for p in projections if p.pack]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(p.weight.numel() * p.weight.element_size() for p in packed) <= share * weights
    if share == 0.0:
        assert not packed
    out_size = decoder.output.weight.numel() * decoder.output.weight.element_size()
    assert decoder.output.pack == (out_size <= share * weights)  # the output layer has the first claim


def test_folding_kv_groups_into_the_query_gives_the_same_attention(tiny_models, monkeypatch):
    """What the GPU does with a mask and grouped kv heads (the memory-efficient kernel takes no groups)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen2"]).eval()  # 4 query heads, 2 kv heads
    assert lean.decoder_for(model).layers[0].groups == 2
    ids = [(7 * i + 3) % (model.config.vocab_size - 10) + 5 for i in range(50)]
    plain = _hidden_states(model, ids, use_lean=True)
    monkeypatch.setattr(lean, "FOLD_GROUPS_ON_CPU", True)
    folded = _hidden_states(model, ids, use_lean=True)
    for a, b in zip(folded, plain):
        assert torch.allclose(a, b, atol=1e-5)
