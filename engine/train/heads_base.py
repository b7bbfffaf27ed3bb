"""The frozen base model as training draft heads sees it, on the runtime the heads will serve on.

Heads read the hidden state of the runtime that runs the model: torch's (transformers, a GGUF
file dequantized to float32) or llama.cpp's (the file as it is, its quantized kernels: the hidden
states differ from torch's by the quantization of activations). So they are trained on that very
runtime's states. What training needs of the base model, either way:

    outputs(windows)   (B, T) token windows -> the last hidden state after each token (B, T, H)
                       and the greedy next token there (B, T)
    output_rows(ids)   the output layer's rows of `ids` (the heads' own output layer starts as them)
    lm_head            the whole output layer, for heads without a reduced vocabulary
    embed              the input embedding, for heads that see the root token
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..protocol import EngineError, EngineSpec


@dataclass
class Base:
    engine: object  # the LocalEngine: its tokenizer, prompt format and stop tokens
    runtime: str  # "torch" or "llamacpp"
    outputs: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    hidden_size: int
    vocab_size: int
    output_rows: Callable[[torch.Tensor], torch.Tensor]
    lm_head: nn.Module | None  # None: a vocabulary too big to hold whole (heads get their own rows)
    embed: nn.Module
    save_to: Path | None  # where the engine finds heads for this model on this runtime


def heads_runtime(model: str | None, device: str | None, asked: str = "auto") -> str:
    """The runtime heads are trained for: `asked`, or with "auto" the one the engine runs the model
    on by default: llama.cpp for a GGUF file on the CPU (where llama-cpp-python imports), else torch."""
    if asked != "auto":
        return asked
    from ..loading.gguf import gguf_file
    from ..runtime.choice import llamacpp_unavailable

    if model is None or device not in (None, "cpu", "auto") or llamacpp_unavailable():
        return "torch"
    if device in (None, "auto") and torch.cuda.is_available():
        return "torch"
    return "llamacpp" if gguf_file(model) is not None else "torch"


def torch_base(model: str | None, device: str | None, threads: int) -> Base:
    from ..loading.torch_load import load_on_torch

    engine = load_on_torch(EngineSpec(model, device=device, dtype="float32"))
    torch.set_num_threads(threads or os.cpu_count() or 1)  # load_on_torch picks decoding's count
    base = engine.model
    for p in base.parameters():
        p.requires_grad_(False)
    lm_head = base.get_output_embeddings()
    return Base(engine, "torch", torch_outputs(base), base.config.hidden_size, lm_head.weight.shape[0],
                lambda ids: lm_head.weight[ids], lm_head, base.get_input_embeddings(),
                Path(engine.model_dir) if engine.model_dir else None)


def torch_outputs(model) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """A transformers model's last hidden states (B, T, H) and greedy next tokens (B, T)."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def outputs(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = model.base_model(input_ids=windows.to(device)).last_hidden_state
        return hidden, model.get_output_embeddings()(hidden).argmax(dim=-1)

    return outputs


def llamacpp_base(model: str | None, threads: int, seq_len: int) -> Base:
    """The GGUF file on llama.cpp: its hidden states with embeddings on (pooling none), one window a
    decode; its token rows read from the file (gguf_rows.py)."""
    from .. import load_engine
    from ..drafts.head_layers import RowEmbedding
    from ..loading.files import cache_root, file_hash
    from ..loading.gguf_rows import GgufRows
    from ..runtime.choice import cpu_threads
    from ..runtime.llamacpp import BATCH, LlamaCppRuntime

    if seq_len > BATCH:
        raise EngineError(f"--seq-len {seq_len} is over the {BATCH} tokens a llama.cpp decode takes here")
    engine = load_engine(model, runtime="llamacpp")
    path = engine.runtime.path
    runtime = LlamaCppRuntime(path, threads or cpu_threads(), n_ctx=max(512, 2 * seq_len), hidden=True)
    rows = GgufRows(path)

    def outputs(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, greedy = zip(*(runtime.every_output(w.tolist()) for w in windows))
        return torch.from_numpy(np.stack(hidden)), torch.from_numpy(np.stack(greedy))

    lm_head = None
    if rows.vocab_size <= 65536:  # a small vocabulary's whole output layer, for heads without their own
        lm_head = nn.Linear(rows.hidden_size, rows.vocab_size, bias=False)
        with torch.no_grad():
            lm_head.weight.copy_(torch.from_numpy(rows.output_rows(range(rows.vocab_size))))
    return Base(engine, "llamacpp", outputs, rows.hidden_size, runtime.n_vocab,
                lambda ids: torch.from_numpy(rows.output_rows(ids.tolist())), lm_head, RowEmbedding(rows),
                cache_root() / "heads" / "llamacpp" / f"{path.stem}-{file_hash(path)}")
