"""Draft sources behind one small interface: each proposes candidate continuations and learns from
what was accepted. The speculative loop never asks which one it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..verify import Candidate


@dataclass
class DraftState:
    """What a draft source may look at to guess the tokens after `context`."""

    context: list[int]  # prompt + accepted tokens + the certain next (root) token
    hidden: torch.Tensor | None = None  # (H,) base model's last hidden state before the root token
    prompt_len: int = 0  # context[:prompt_len] is the prompt (it holds the text after the cursor too)
    max_len: int = 8  # no use guessing beyond the remaining token budget


class DraftSource(Protocol):
    name: str
    # A source whose drafting has a real cost (the heads run the vocabulary projection K times) can
    # stand by: it is asked only when the cheap sources have nothing for this step.
    standby: bool

    def propose(self, state: DraftState) -> list[Candidate]: ...

    def observe(self, state: DraftState, accepted: list[int]) -> None:
        """Learn from the tokens accepted after `state.context` (the root token excluded)."""


@dataclass
class DraftStats:
    """Per source: nodes drafted into trees and nodes accepted."""

    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)

    def add(self, source: str, drafted: int = 0, accepted: int = 0) -> None:
        self.drafted[source] = self.drafted.get(source, 0) + drafted
        self.accepted[source] = self.accepted.get(source, 0) + accepted

    def to_json(self) -> dict:
        return {s: {"drafted": self.drafted.get(s, 0), "accepted": self.accepted.get(s, 0),
                    "rate": round(self.accepted.get(s, 0) / self.drafted[s], 4) if self.drafted.get(s) else 0.0}
                for s in sorted(set(self.drafted) | set(self.accepted))}
