"""8-bit linear layers: close to float, a token's result independent of its batch, and speculative
decoding of an int8 model equal to that model's own greedy decoding."""

import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.int8 import Int8Linear, is_int8, quantize_int8
from torch import nn


@pytest.mark.parametrize("weight_only", [False, True])
def test_an_int8_layer_is_close_to_its_float_layer(weight_only):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True).requires_grad_(False)
    x = torch.randn(3, 5, 64)
    q = Int8Linear(linear, weight_only)
    expected = linear(x)
    got = q(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert (got - expected).abs().max() / expected.abs().max() < 0.03
    assert torch.allclose(q.weight, linear.weight, atol=float(linear.weight.abs().max()) / 100)


def test_a_tokens_result_does_not_depend_on_the_tokens_beside_it():
    # per-tensor activation scales (torch's quantize_dynamic) would fail this: a loud token beside
    # a quiet one changes the quiet one's result, and verified drafts would differ from greedy.
    # Integer sums are exact, so the int8 x int8 path is bit-equal, not just close.
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(32, 16, bias=False))
    batch = torch.randn(4, 32)
    batch[0] *= 50
    assert torch.equal(q(batch)[2:3], q(batch[2:3]))
    weight_only = Int8Linear(nn.Linear(32, 16, bias=False), weight_only=True)  # float sums: as float32 is
    assert torch.allclose(weight_only(batch)[2:3], weight_only(batch[2:3]), atol=1e-5)


def test_few_rows_padded_for_the_fast_kernel_give_the_same_results_as_in_a_batch():
    # oneDNN's packed kernel is 30-300x slower for some row counts under 4 (MIN_PACKED_ROWS): such
    # calls are padded, and must come out exactly as those rows would in a larger batch
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(256, 128, bias=True))
    batch = torch.randn(8, 256)
    full = q(batch)
    for count in range(1, 7):
        assert torch.equal(q(batch[:count]), full[:count])
    assert q(batch[:1].reshape(1, 1, 256)).shape == (1, 1, 128)


def test_quantize_int8_replaces_every_linear_and_keeps_the_embedding():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 10))
    quantize_int8(model)
    assert is_int8(model) and not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model[0], nn.Embedding)
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 10)


def test_an_int8_engine_decodes_speculatively_exactly_as_its_own_greedy(tiny_model_dir):
    float_engine = load_engine(str(tiny_model_dir))
    engine = load_engine(str(tiny_model_dir), dtype="int8")
    assert engine.status()["dtype"] == "int8" and float_engine.status()["dtype"] == "float32"
    int8_bytes = sum(b.numel() * b.element_size() for b in engine.model.buffers())
    assert int8_bytes > 0
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
    ids = engine.prompt_ids(prompt, "")
    greedy = engine.generate(ids, 24, speculative=False)
    assert engine.generate(ids, 24, speculative=True) == greedy
    assert len(greedy) > 0


def test_an_int8_engine_with_a_draft_model_is_lossless(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), dtype="int8", draft_model=str(tiny_model_dir))
    assert is_int8(engine.speculator.drafters[-1].model)
    ids = engine.prompt_ids("class Stack:\n    def push(self, item):\n        self.items", "")
    assert engine.generate(ids, 20, speculative=True) == engine.generate(ids, 20, speculative=False)
