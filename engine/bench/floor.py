"""The memory floor of a decoding step: what one plain token must read (every weight the step
multiplies by, once, and the KV cache of the prompt), over this machine's measured read bandwidth.

A single-token step on a CPU is bound by reading the weights; a step far above this floor loses
its time elsewhere (Python, small operations, allocations), and one near it can only get faster by
reading less (int8, a smaller model, fewer layers).
"""

from __future__ import annotations

import time

import torch
from torch import nn


def read_bandwidth_gbs(megabytes: int = 256, repeats: int = 5) -> float:
    """The best of `repeats` sums over a buffer too large for any cache, in GB/s read."""
    buffer = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of every weight a single-token step reads: all parameters and buffers of the layers,
    less the input embedding (one row is read; an output layer tied to it reads it whole)."""
    embedding = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and getattr(output, "weight", None) is not None and \
        output.weight is getattr(embedding, "weight", None)
    skip = {id(t) for t in embedding.parameters()} if embedding is not None and not tied else set()
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen or id(tensor) in skip or not tensor.is_floating_point() and tensor.dtype != torch.int8:
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


def kv_bytes_per_token(model: nn.Module, cached_tokens: int, element_size: int) -> int:
    """Bytes of the KV cache a step attends over: keys and values of every layer."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * cached_tokens * element_size


def floor(model: nn.Module, cached_tokens: int, plain_ms_per_token: float, kv_element_size: int = 4) -> dict:
    weights = weight_bytes_per_token(model)
    kv = kv_bytes_per_token(model, cached_tokens, kv_element_size)
    bandwidth = read_bandwidth_gbs()
    floor_ms = (weights + kv) / (bandwidth * 1e9) * 1000
    return {"weight_mb": round(weights / 1e6, 2), "kv_mb": round(kv / 1e6, 2), "cached_tokens": cached_tokens,
            "read_gb_per_s": round(bandwidth, 2), "floor_ms": round(floor_ms, 3),
            "plain_ms_per_token": round(plain_ms_per_token, 3),
            "times_floor": round(plain_ms_per_token / floor_ms, 2) if floor_ms else None}
