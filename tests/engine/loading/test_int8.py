"""8-bit linear layers: close to float, a token's result independent of its batch, and speculative
decoding of an int8 model equal to that model's own greedy decoding."""

import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.loading.int8 import PACKED_KERNELS, Int8Linear, is_int8, quantize_int8, weight_levels
from torch import nn


@pytest.fixture(params=["packed", "int_mm"])
def kernel(request, monkeypatch):
    """Each test that takes it runs on oneDNN's packed kernel (where there is one) and again on the
    torch._int_mm fallback that CPUs without it use."""
    if request.param == "packed" and not PACKED_KERNELS:
        pytest.skip("no oneDNN int8 kernels here")
    if request.param == "int_mm":
        monkeypatch.setattr(Int8Linear, "packed", lambda self: None)
    return request.param


def exact_int8_product(q: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """What the layer must compute: the same per-token quantized activations times the int8
    weights, summed in int64 (no saturation anywhere), scaled back."""
    x_scale = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127.0
    x_q = torch.round(x.float() / x_scale).long()
    sums = x_q @ q.qweight.long().t()
    out = sums.double() * q.scale.double() * x_scale.double()
    return out if q.bias is None else out + q.bias.double()


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


def test_the_integer_sums_are_exact_even_for_the_loudest_values(kernel):
    # AVX2's vpmaddubsw adds two uint8 x int8 products into a saturating int16: with 8-bit weights
    # a loud token (every activation at 127) times loud weights overflowed it and the layer was 30%
    # off. weight_levels() probes for that; whatever it chose, the sums must be the exact ones.
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True).requires_grad_(False)
    linear.weight[:8] = torch.sign(torch.randn(8, 256))  # rows at full scale: every weight is +-levels
    q = Int8Linear(linear)
    assert int(q.qweight.abs().max()) == weight_levels()
    x = torch.randn(6, 256)
    x[0] = 1.0  # every activation at the top of its range
    x[1] = torch.sign(linear.weight[0])  # each product at its largest, all of one sign
    got = q(x).double()
    expected = exact_int8_product(q, x)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4), (got - expected).abs().max()


@pytest.mark.skipif(not PACKED_KERNELS, reason="no oneDNN int8 kernels here: torch._int_mm's sums are exact")
def test_the_weight_levels_match_what_the_kernel_can_hold():
    # 8-bit weights only where a pair of the loudest products fits the kernel's arithmetic
    assert weight_levels() in (63, 127)
    levels = weight_levels()
    probe = nn.Linear(64, 1, bias=False).requires_grad_(False)
    probe.weight.fill_(1.0)
    q = Int8Linear(probe)
    assert float(q(torch.ones(1, 64))) == pytest.approx(64.0, rel=1e-6)  # 64 x levels x 127, scaled back
    assert int(q.qweight.max()) == levels


def test_an_int8_layer_with_outlier_channels_stays_close_to_float():
    # real activations have a few loud channels (after a norm, a handful 10-50x the rest), which set
    # each token's scale: the quiet channels lose the most there
    torch.manual_seed(1)
    linear = nn.Linear(512, 256, bias=False).requires_grad_(False)
    x = torch.randn(16, 512)
    x[:, :4] *= 20
    q = Int8Linear(linear)
    expected = linear(x)
    error = (q(x) - expected).norm() / expected.norm()
    assert error < 0.05, error


def loud_channel_layer(seed: int = 0):
    """A layer whose input has a few channels 30x louder than the rest, as real activations do,
    with those channels' absmax as a calibration pass would find them."""
    torch.manual_seed(seed)
    linear = nn.Linear(256, 64, bias=True).requires_grad_(False)
    loudness = torch.ones(256)
    loudness[[3, 50, 77, 200]] = 30.0

    def inputs(rows):
        return torch.randn(rows, 256) * loudness

    return linear, inputs, inputs(64).abs().amax(dim=0)


def test_loud_channels_kept_apart_bring_the_layer_closer_to_float(kernel):
    linear, inputs, absmax = loud_channel_layer()
    x = inputs(32)
    expected = linear(x)
    one_group = (Int8Linear(linear)(x) - expected).norm() / expected.norm()
    two_groups = (Int8Linear(linear, input_absmax=absmax)(x) - expected).norm() / expected.norm()
    assert two_groups < one_group / 2, (two_groups, one_group)
    q = Int8Linear(linear, input_absmax=absmax)
    assert set(q.outliers.tolist()) >= {3, 50, 77, 200}
    assert torch.allclose(q.weight, linear.weight, atol=float(linear.weight.abs().max()) / 50)


def test_with_loud_channels_apart_a_token_still_does_not_depend_on_its_neighbours(kernel):
    linear, inputs, absmax = loud_channel_layer(1)
    q = Int8Linear(linear, input_absmax=absmax)
    batch = inputs(9)
    batch[0] *= 50
    full = q(batch)
    for count in range(1, 9):
        assert torch.equal(q(batch[:count]), full[:count])
    assert torch.equal(q(batch[4:5]), full[4:5])


def test_fused_projections_compute_what_each_computes_alone(kernel):
    linear, inputs, absmax = loud_channel_layer(2)
    other = nn.Linear(256, 32, bias=True).requires_grad_(False)
    a, b = Int8Linear(linear, input_absmax=absmax), Int8Linear(other, input_absmax=absmax)
    x = inputs(5)
    alone = torch.cat([a(x), b(x)], dim=-1)
    fused = Int8Linear.fused([a, b])
    assert torch.equal(fused(x), alone)
    with pytest.raises(ValueError):
        Int8Linear.fused([Int8Linear(linear, input_absmax=absmax), Int8Linear(other)])


def test_a_tokens_result_does_not_depend_on_the_tokens_beside_it(kernel):
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


def test_a_calibration_pass_finds_each_layers_loud_channels(kernel):
    torch.manual_seed(0)
    embedding = nn.Embedding(50, 128)
    embedding.weight.data[:, 7] *= 40  # one loud channel entering the first layer
    model = nn.Sequential(embedding, nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 50))
    ids = torch.randint(0, 50, (1, 40))
    expected = model(ids)
    quantize_int8(model, calibration=ids)
    assert 7 in model[1].outliers.tolist() and model[3].outliers is not None
    assert ((model(ids) - expected).norm() / expected.norm()) < 0.03


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


def test_an_int8_layer_with_loud_channels_takes_bfloat16_activations(kernel):
    linear, inputs, absmax = loud_channel_layer(3)
    q = Int8Linear(linear.to(torch.bfloat16), input_absmax=absmax).to(torch.bfloat16)
    assert q.outlier_qweight.dtype == torch.int8  # integers stay integers through .to()
    out = q(inputs(3).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 64)
