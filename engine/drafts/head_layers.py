"""The draft heads as torch modules (drafts/heads.py says what they are): what `memosight train
heads` trains and the torch runtime runs. The llama.cpp runtime runs the same weights in numpy
(heads.NumpyHeads), so that its process never imports torch."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from .heads_files import CONFIG_FILE, WEIGHTS_FILE, HeadsConfig


class ResBlock(nn.Module):
    """Medusa's block, x + silu(W x), or with `inner_size` an MLP block x + W2 silu(W1 x). Either
    starts as the identity (its last layer is zero)."""

    def __init__(self, hidden_size: int, inner_size: int = 0):
        super().__init__()
        self.linear = nn.Linear(hidden_size, inner_size or hidden_size)
        self.act = nn.SiLU()
        self.down = nn.Linear(inner_size, hidden_size) if inner_size else None
        last = self.down if self.down is not None else self.linear
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.linear(x))
        return x + (self.down(y) if self.down is not None else y)


class DraftHeads(nn.Module):
    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        # A comprehension, not [block] * K: each head needs its own weights.
        self.heads = nn.ModuleList(nn.Sequential(*[ResBlock(h, config.inner_size) for _ in range(config.num_layers)])
                                   for _ in range(config.num_heads))
        self.token_in = nn.Linear(h, h, bias=False) if config.token_input else None
        if self.token_in is not None:
            nn.init.zeros_(self.token_in.weight)  # starts by ignoring the token: the plain Medusa heads
        self.out = nn.Linear(h, config.vocab_size, bias=False) if config.vocab_size else None
        if self.out is not None:
            self.out.weight.requires_grad_(False)  # the model's own rows (attach_output)
        self.register_buffer("vocab_ids", torch.arange(config.vocab_size, dtype=torch.long))

    @torch.no_grad()
    def attach_output(self, lm_head: nn.Module) -> None:
        """The output layer's rows: the model's own lm_head rows of `vocab_ids`."""
        if self.out is not None:
            self.out.weight.copy_(lm_head.weight[self.vocab_ids].to(self.out.weight.dtype))

    def forward(self, hidden: torch.Tensor, token_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) -> (K, ..., H): one transformed hidden state per head. `token_embedding` (..., H):
        the root token's embedding in the base model, for heads with `token_input`."""
        if self.token_in is not None:
            if token_embedding is None:
                raise ValueError("these heads take the root token's embedding too")
            hidden = hidden + self.token_in(token_embedding)
        return torch.stack([head(hidden) for head in self.heads])

    def logits(self, transformed: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """(K, ..., H) -> (K, ..., V'): over the reduced vocabulary (`vocab_ids` maps a column to its
        token), or over the whole one through the base model's `lm_head`."""
        if self.out is not None:
            return self.out(transformed)
        if lm_head is None:
            raise ValueError("these heads use the base model's lm_head: pass it")
        return lm_head(transformed)

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logits columns."""
        return self.vocab_ids[columns] if self.out is not None else columns

    def save(self, folder: Path, extra: dict | None = None, dtype: torch.dtype = torch.float32) -> None:
        """The weights (in `dtype`) and config beside a model; `extra` (what they were trained on,
        figures) goes into the config file for people, and is ignored when loading."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
                   for k, v in self.state_dict().items() if k != "out.weight"}  # the model's own rows
        save_file(weights, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=2))

    @classmethod
    def load(cls, folder: Path) -> "DraftHeads | None":
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            return None
        stored = json.loads((folder / CONFIG_FILE).read_text())
        heads = cls(HeadsConfig(**{k: stored[k] for k in HeadsConfig.__dataclass_fields__ if k in stored}))
        weights = load_file(str(folder / WEIGHTS_FILE))
        weights.setdefault("vocab_ids", heads.vocab_ids)  # heads saved before the reduced vocabulary
        if heads.out is not None:
            weights["out.weight"] = heads.out.weight  # filled by attach_output
        heads.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()})
        return heads.eval()


class RowEmbedding(nn.Module):
    """A token's input embedding read from a GGUF file's rows (gguf_rows.py), for heads that see
    the root token on the llama.cpp runtime."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1).tolist()
        out = torch.from_numpy(self.rows.embedding(flat[0]) if len(flat) == 1 else self.rows.embedding_rows(flat))
        return out.reshape(*tokens.shape, -1)
