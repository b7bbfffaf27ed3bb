"""Auxiliary draft heads (Medusa-style) on the base model's last hidden state.

Head k (k = 1..K) guesses the token k positions after the one the base model's lm_head predicts:
a residual block (zero-initialised, so it starts as the identity) followed by the base model's own,
frozen lm_head. Saved beside the model as draft_heads.safetensors + draft_heads.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..verify import Candidate
from .base import DraftSource, DraftState, StepOutcome

WEIGHTS_FILE = "draft_heads.safetensors"
CONFIG_FILE = "draft_heads.json"


@dataclass
class HeadsConfig:
    hidden_size: int  # the base model's hidden size
    num_heads: int = 4  # K: head k guesses token t+1+k
    num_layers: int = 1  # residual blocks per head


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # zero: the block starts as the identity
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class DraftHeads(nn.Module):
    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.config = config
        # A comprehension, not [block] * K: each head needs its own weights.
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
            for _ in range(config.num_heads))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (K, ..., H): one transformed hidden state per head; apply lm_head for logits."""
        return torch.stack([head(hidden) for head in self.heads])

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2))

    @classmethod
    def load(cls, folder: Path) -> "DraftHeads | None":
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            return None
        heads = cls(HeadsConfig(**json.loads((folder / CONFIG_FILE).read_text())))
        heads.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
        return heads.eval()


class HeadDrafter(DraftSource):
    """Proposes the best paths through the heads' top-k guesses (a small beam over joint probability)."""

    name = "heads"
    standby = True  # K vocabulary projections a step: worth it only when nothing cheaper has a guess

    def __init__(self, heads: DraftHeads, lm_head: nn.Module, top_k: tuple[int, ...] = (4, 3, 2, 2),
                 beams: int = 6, confident: float = 0.8, min_prob: float = 0.3):
        self.heads = heads
        self.lm_head = lm_head
        self.dtype = lm_head.weight.dtype  # read once: an int8 output layer dequantizes to answer
        self.top_k = top_k
        self.beams = beams
        # A drafted node costs a row of the verification pass whether or not it is accepted: guesses
        # whose joint probability falls below this are not worth their row.
        self.min_prob = min_prob
        self.confident = confident  # probability above which a guess is also offered as a hint
        self.last_top1: list[int] = []  # each head's first guess at the last ask, to score it
        self.hits: list[int] = []  # per head: times its top-1 was the greedy token
        self.tries: list[int] = []

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> HeadDrafter | None:
        heads = DraftHeads.load(Path(model_dir)) if model_dir else None
        if heads is None:
            return None
        weight = model.get_output_embeddings().weight
        heads.to(device=weight.device, dtype=weight.dtype)
        return cls(heads, model.get_output_embeddings())

    @torch.inference_mode()
    def guesses(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k probabilities and tokens per head: (K, k) each, k = max(top_k)."""
        logits = self.lm_head(self.heads(hidden.to(self.dtype)))  # (K, V)
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.topk(probs, max(self.top_k), dim=-1)

    def propose(self, state: DraftState) -> list[Candidate]:
        self.last_top1 = []
        if state.hidden is None:
            return []
        probs, tokens = self.guesses(state.hidden)
        depth = min(len(self.top_k), probs.shape[0], state.max_len)
        probs, tokens = probs.tolist(), tokens.tolist()
        self.last_top1 = [tokens[d][0] for d in range(len(probs))]
        confident = []  # the first guesses, for as long as each is likely: a hint for later steps
        for d in range(len(probs)):
            if probs[d][0] < self.confident:
                break
            confident.append(tokens[d][0])
        beams: list[tuple[float, list[int]]] = [(1.0, [])]
        kept: list[tuple[float, list[int]]] = []  # every beam prefix worth its row; the tree merges prefixes
        for d in range(depth):
            grown = [(p * probs[d][j], seq + [tokens[d][j]]) for p, seq in beams for j in range(self.top_k[d])]
            beams = [b for b in sorted(grown, key=lambda b: -b[0])[: self.beams] if b[0] >= self.min_prob]
            kept.extend(beams)
        out = [Candidate(seq, self.name, score=p) for p, seq in kept]
        if confident:
            out.append(Candidate(confident, self.name, hint=True))
        return out

    def observe(self, outcome: StepOutcome) -> None:
        """Score each head's first guess against what greedy decoding chose there."""
        if self.name not in outcome.proposals or not outcome.verified:
            return
        truth = outcome.accepted + [outcome.next_token]
        for d in range(min(len(self.last_top1), len(truth))):
            while len(self.hits) <= d:
                self.hits.append(0)
                self.tries.append(0)
            self.tries[d] += 1
            self.hits[d] += int(self.last_top1[d] == truth[d])

    def reset(self) -> None:
        self.last_top1, self.hits, self.tries = [], [], []

    def stats(self) -> dict:
        return {"head_accuracy": [round(h / t, 4) if t else 0.0 for h, t in zip(self.hits, self.tries)]}
