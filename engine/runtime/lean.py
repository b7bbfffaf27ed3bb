"""A lean forward pass for Llama-family decoders (Llama, Qwen2), for decoding only.

The transformers forward is general: mask factories, output capture, per-module hooks and three
separate projections where one would do. For a small model on a CPU that bookkeeping costs more than
the arithmetic (about 60 tensor operations and 40 module calls a layer for one token). This pass
runs the same weights through the same formulas with fused projections and far fewer operations,
writing into the same transformers cache, so everything else (cropping, the prefix tree, tree
verification) is unchanged. A one-token step is bit for bit the transformers forward's; in float32
on a CPU a pass of several tokens uses packed weights (see _Projection), the same arithmetic with
its sums grouped differently (MEMOSIGHT_PACK=0: bit for bit there too). Models it does not
recognise keep the transformers forward.
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F

from ..loading.int8 import Int8Linear
from ..loading.memory import give_back

# Architectures whose decoder layer is exactly: RMSNorm, attention (q/k/v/o, RoPE), RMSNorm, SiLU MLP.
SUPPORTED = {"LlamaForCausalLM", "Qwen2ForCausalLM"}

# model -> (what its weights were when the decoder was built, the decoder or None)
_decoders: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, LeanDecoder | None]]" = weakref.WeakKeyDictionary()
enabled = os.environ.get("MEMOSIGHT_LEAN", "1") != "0"  # MEMOSIGHT_LEAN=0 keeps the transformers forward
# float32 passes of several tokens through oneDNN's packed weights (see _Projection); MEMOSIGHT_PACK=0: off
PACK_FLOAT32 = os.environ.get("MEMOSIGHT_PACK", "1") != "0" and torch.backends.mkldnn.is_available()
# The packed copies' share of the model's weights: memory stays within 1.1x the weights (plus the
# KV cache). A whole second copy took Qwen2.5-Coder-0.5B from 3.3 to 5.3 GB resident.
PACKED_SHARE = 0.1
# kv head groups folded into the query on a CPU too: for the test of the GPU's attention (see __call__)
FOLD_GROUPS_ON_CPU = False


def decoder_for(model) -> "LeanDecoder | None":
    """The lean decoder of `model`, built on first use; None where the model is not supported."""
    if not enabled:
        return None
    signature = _weights_signature(model)
    built = _decoders.get(model)
    if built is None or built[0] != signature:
        # New, or converted in place since (dtype "auto" measures in float32, then `.to(bfloat16)` or
        # int8 layers): a decoder built before would still hold the old weights, fused and packed.
        _decoders[model] = built = (signature, LeanDecoder.build(model))
        give_back()  # the weights it fused were freed in pieces the heap would otherwise keep
    return built[1]


def forget(model) -> None:
    """Drop `model`'s decoder (its fused and packed copies with it): its weights are about to change."""
    _decoders.pop(model, None)


def _weights_signature(model) -> tuple:
    """What changes when a model's weights are converted in place: the first projection's module
    type (int8 layers replace nn.Linear), dtype and device."""
    try:
        projection = model.base_model.layers[0].self_attn.q_proj
        weight = projection.weight
        return type(projection), weight.dtype, weight.device
    except (AttributeError, IndexError, TypeError):
        return ()


class _Norm:
    """An RMSNorm's weight and epsilon as plain attributes (nn.Module's lookups cost more than a
    small operation)."""

    def __init__(self, norm) -> None:
        self.weight, self.eps = norm.weight.detach(), norm.variance_epsilon


def _rms_norm(x: torch.Tensor, norm: _Norm) -> torch.Tensor:
    # The transformers formula, step for step, so the results match it bit for bit.
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Projection:
    """F.linear with a fixed weight, called like a layer.

    On a CPU in float32, a pass of several tokens (a draft tree, a prefill) goes through a copy of
    the weight packed once in oneDNN's layout: MKL's F.linear costs nearly a token per extra row
    at small batches, the packed kernel does not (measured here, 1 thread: SmolLM2's 49,152 x 576
    output layer 9.0 ms for 1 row either way, 19.1 vs 10.1 ms for 4 rows, 27.7 vs 14.9 for 16; its
    30 layers 78 vs 54 ms for 16 rows). One row keeps F.linear, bit for bit the transformers
    forward's. Both are float32 arithmetic; the sums are only grouped differently, as they already
    are between F.linear's one-row and many-row kernels. The cost is a second copy of the weight,
    so only some projections are packed (PACKED_SHARE).

    Rows go in padded to a power of two: oneDNN keeps a compiled kernel and its state for every
    (weight, row count) it meets, ~0.6 MB and 25 ms to make each (measured here: 12,288 x 256, row
    counts 1..299: +176 MB). Prompt tails and trees of every length grew the server by ~270 MB over
    10,000 fuzz messages (issue 41); with a handful of row counts a weight, it stays flat."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.packed: torch.Tensor | None = None
        self.pack = PACK_FLOAT32 and weight.device.type == "cpu" and weight.dtype == torch.float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.pack or x.numel() == x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        if self.packed is None:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 16)
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        bucket = 1 << (count - 1).bit_length()
        if bucket != count:  # zero rows up to a power of two, dropped from the output
            rows = F.pad(rows, (0, 0, 0, bucket - count))
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")[:count]
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _projection(linear) -> "_Projection | Int8Linear":
    """A model's linear layer as the lean pass calls it (int8 layers as they are)."""
    if isinstance(linear, Int8Linear):
        return linear
    return _Projection(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())


def _fuse(*linears):
    """One projection for several of the same input; the originals' weights become views of its
    weights, so no memory is duplicated and the transformers forward keeps working."""
    if all(isinstance(lin, Int8Linear) for lin in linears):
        return Int8Linear.fused(list(linears))
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    bias = torch.cat([lin.bias.detach() for lin in linears]) if all(has_bias) else None
    if any(has_bias) and bias is None:
        raise ValueError("projections with and without bias")
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start:start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = torch.nn.Parameter(bias[start:start + rows], requires_grad=False)
        start += rows
    return _Projection(weight, bias)


class _Layer:
    def __init__(self, layer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = _Norm(layer.input_layernorm), _Norm(layer.post_attention_layernorm)
        self.qkv = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
        self.q_size, self.kv_size = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
        self.o_proj = _projection(attn.o_proj)
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.groups = attn.num_key_value_groups
        self.gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
        self.down_proj = _projection(mlp.down_proj)


class LeanDecoder:
    def __init__(self, model) -> None:
        base = model.base_model
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.norm = _Norm(base.norm)
        self.layers = [_Layer(layer) for layer in base.layers]
        self.output = _projection(model.get_output_embeddings())  # several rows at once: a tree's logits
        projections = [p for layer in self.layers for p in (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj)]
        projections = [p for p in [self.output] + projections if isinstance(p, _Projection)]
        if any(p.pack for p in projections) and not _packing_pays(self.layers[0].gate_up):
            for projection in projections:
                projection.pack = False
        # A packed weight is a second copy: the copies may take PACKED_SHARE of the model's weights,
        # the output layer first (a tree's logits), then the layers in order; the rest stay plain.
        budget = PACKED_SHARE * sum(p.numel() * p.element_size() for p in model.parameters())
        for projection in projections:
            size = projection.weight.numel() * projection.weight.element_size()
            if projection.pack and size <= budget:
                budget -= size
            else:
                projection.pack = False
        # int8 x int8 layers round every activation to 1/127 of its row's largest value, which turns
        # the last-bit differences that attention's sums have between a one-token step and a
        # verification pass of many into different tokens (measured on SmolLM2-135M: speculative
        # output left plain greedy's within 7-23 tokens on 5 of 5 prompts). In float64 those
        # differences stay below float32's rounding, and both agree again (5 of 5).
        self.attention_dtype = torch.float64 if any(
            isinstance(layer.qkv, Int8Linear) and not layer.qkv.weight_only for layer in self.layers) else None

    @classmethod
    def build(cls, model) -> "LeanDecoder | None":
        config = model.config
        if type(model).__name__ not in SUPPORTED or getattr(config, "hidden_act", "silu") != "silu":
            return None
        if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
            return None
        if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
            return None  # sliding-window layers need their own masks
        base = model.base_model
        for layer in base.layers:
            attn = layer.self_attn
            if hasattr(attn, "q_norm") or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
                return None
        try:
            return cls(model)
        except (AttributeError, ValueError):
            return None

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, cache, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The last hidden state (1, T, H) for `input_ids` (1, T) appended to `cache`.

        `attention_mask` is additive (1, 1, T, past + T); without one the new tokens attend causally."""
        t = input_ids.shape[1]
        past = cache.get_seq_length()
        x = self.embed(input_ids)
        cos, sin = self.rotary(x, position_ids=position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        causal = False
        if attention_mask is None and t > 1:
            if past == 0:
                causal = True
            else:
                attention_mask = _causal_mask(t, past, x.dtype, x.device)
        mask = attention_mask
        if self.attention_dtype is not None and mask is not None:  # once, not per layer
            mask = mask.to(self.attention_dtype)
        # On CUDA with a mask, grouped kv heads would send attention to the math kernel (the
        # memory-efficient one takes no groups; flash, no mask), which copies every cached cell to
        # every query head: each kv head's query heads go in as one longer query instead.
        groups = self.layers[0].groups
        fold = mask is not None and (mask.is_cuda or FOLD_GROUPS_ON_CPU) and groups > 1
        if fold:
            mask = mask.expand(1, 1, t, mask.shape[-1]).repeat(1, 1, groups, 1)
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm)
            qkv = layer.qkv(h)
            q, k, v = qkv.split((layer.q_size, layer.kv_size, layer.kv_size), dim=-1)
            q = q.view(1, t, -1, layer.head_dim).transpose(1, 2)
            k = k.view(1, t, -1, layer.head_dim).transpose(1, 2)
            v = v.view(1, t, -1, layer.head_dim).transpose(1, 2)
            k, q = _rotate(k, cos, sin), _rotate(q, cos, sin)
            if self.attention_dtype is not None:
                # the cache itself holds float64: converting it whole at every step cost more than
                # the int8 layers' sums saved (2.3 of 27 ms a token at 300 cached tokens)
                q, k, v = q.to(self.attention_dtype), k.to(self.attention_dtype), v.to(self.attention_dtype)
            k, v = cache.layers[i].update(k, v)
            # Grouped kv heads go to SDPA as they are: repeating them (as transformers does when
            # there is a mask) copies the whole cache every step, and gives the same numbers.
            if fold:
                kv_heads = k.shape[1]
                out = F.scaled_dot_product_attention(q.reshape(1, kv_heads, groups * t, layer.head_dim), k, v,
                                                     attn_mask=mask, scale=layer.scaling)
                out = out.reshape(1, kv_heads * groups, t, layer.head_dim)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                     scale=layer.scaling, enable_gqa=layer.groups > 1)
            x = x + layer.o_proj(out.transpose(1, 2).reshape(1, t, -1).to(x.dtype))
            h = _rms_norm(x, layer.post_norm)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down_proj(F.silu(gate) * up)
        return _rms_norm(x, self.norm)


def _packing_pays(projection: "_Projection", rows: int = 8, repeats: int = 5) -> bool:
    """Whether packed weights beat F.linear here, timed on one of the model's own projections for
    a small batch: they do for SmolLM2's (576 wide), they do not for the embedded model's (256 wide:
    its speculative decoding went from 2.63x to 2.34x transformers' greedy with them)."""
    import time

    x = torch.randn(rows, projection.weight.shape[1], dtype=projection.weight.dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(projection.weight.detach(), 16)
    timings = {}
    for name, run in (("plain", lambda: F.linear(x, projection.weight, projection.bias)),
                      ("packed", lambda: torch.ops.mkldnn._linear_pointwise(x, packed, projection.bias, "none",
                                                                          [], ""))):
        run()
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        timings[name] = time.perf_counter() - started
    return timings["packed"] < 0.9 * timings["plain"]


def output_layer(model):
    """The model's output layer as a callable: the lean decoder's (packed for several rows, see
    _Projection) where there is one, else the model's own."""
    lean = decoder_for(model)
    return lean.output if lean is not None else model.get_output_embeddings()


def _causal_mask(t: int, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive (1, 1, t, past + t): new token i sees the cache and new tokens up to i."""
    mask = torch.full((t, past + t), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, :past] = 0
    mask[:, past:].triu_(1)
    return mask[None, None]
