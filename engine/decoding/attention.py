"""What the model itself looks at: the attention the lines above a cursor pay to each earlier line.

The seed's attention-based importance. For each asked row, one forward pass over the window of text
that ends at that row (at most `window_tokens` tokens); the attention of the `query_lines` lines
just above the row, averaged over their tokens, the layers and the heads, is summed by the line each
key token belongs to. Only lines above the row are queries, so the text at and below it (the line
being written) cannot have been seen. Reused by the context packer as a region score.

Attention weights come from the eager attention of transformers' own modules, caught by a hook on
each layer and reduced at once, so a long window never holds every layer's (heads, T, T) at once.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

SINK_TOKENS = 4  # the window's first tokens soak up attention whatever they say (attention sinks)


@contextmanager
def _eager_attention(model):
    """The model with eager attention (which returns its weights) for the duration."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def line_attention(model, encode, text: str, rows: list[int], query_lines: int = 8,
                   window_tokens: int = 1024) -> dict[int, tuple[int, list[float]]]:
    """For each row of `rows`: (first line, masses), masses[i] the share of attention that the
    tokens of the `query_lines` lines above that row pay to line first_line + i (the window's
    first SINK_TOKENS aside; the shares of the lines before the query sum to at most 1)."""
    lines = text.split("\n")
    line_ids = [encode(line + "\n") if i < len(lines) - 1 else encode(line) for i, line in enumerate(lines)]
    attention_layers = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    out: dict[int, tuple[int, list[float]]] = {}
    for row in sorted(set(rows)):
        query_start = max(0, row - query_lines)
        query_tokens = sum(len(ids) for ids in line_ids[query_start:row])
        if query_tokens == 0 or query_start == 0:
            continue
        # the window: the query lines and as many whole lines before them as fit
        first, tokens = query_start, query_tokens
        while first > 0 and tokens + len(line_ids[first - 1]) <= window_tokens:
            first -= 1
            tokens += len(line_ids[first])
        ids = [t for ids in line_ids[first:row] for t in ids][-window_tokens:]
        owner = [i for i in range(first, row) for _ in line_ids[i]][-len(ids):]
        n_query = min(query_tokens, len(ids))
        total = torch.zeros(len(ids))
        count = [0]

        def hook(_module, _inputs, output):
            weights = output[1]  # (1, heads, T, T)
            total.add_(weights[0, :, -n_query:, :].float().mean(dim=(0, 1)).cpu())
            count[0] += 1

        handles = [m.register_forward_hook(hook) for m in attention_layers]
        try:
            with torch.inference_mode(), _eager_attention(model):
                model(torch.tensor([ids], device=next(model.parameters()).device), use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        if not count[0]:
            raise RuntimeError("no attention weights caught: the model's attention modules did not return them")
        shares = total / count[0]
        shares[:SINK_TOKENS] = 0
        masses = [0.0] * (query_start - first)
        for position, line in enumerate(owner):
            if line < query_start:
                masses[line - first] += float(shares[position])
        out[row] = (first, masses)
    return out
