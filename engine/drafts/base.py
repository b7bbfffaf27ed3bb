"""What every draft source is: the state it drafts from, the interface it implements, and what a
verification step tells it afterwards."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..decoding.verify import Candidate

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass
class DraftState:
    """What a draft source may look at to guess the tokens after `context`."""

    context: list[int]  # prompt + accepted tokens + the certain next (root) token
    # (H,) base model's last hidden state before the root token: a tensor on torch, an array on llama.cpp
    hidden: torch.Tensor | np.ndarray | None = None
    prompt_len: int = 0  # context[:prompt_len] is the prompt (it holds the text after the cursor too)
    max_len: int = 8  # no use guessing beyond the remaining token budget


@dataclass
class StepOutcome:
    """What one verification step decided, for every source to learn from."""

    state: DraftState  # what the sources were shown
    proposals: dict[str, list[Candidate]]  # per source asked this step, what it proposed
    accepted: list[int]  # drafted tokens the base model agreed with, after the root
    next_token: int  # the base model's own choice after the accepted ones (certain, not yet emitted)
    verified: bool  # whether a tree of guesses was verified (False: a plain step)


class DraftSource:
    """One way to guess the next tokens. Subclasses implement `propose`; the rest is optional."""

    name = "source"
    # A source whose drafting has a real cost (the heads run the vocabulary projection K times) can
    # stand by: it is asked only when the sources before it have nothing for this step.
    standby = False

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> DraftSource | None:
        """This source for a loaded model, or None where it has nothing to draft with (its files
        beside the model are missing)."""
        return cls()

    def propose(self, state: DraftState) -> list[Candidate]:
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a verification step (called every step, whether or not this source was asked)."""

    def finish(self, tokens: list[int]) -> None:
        """A request ended: `tokens` is the end of its prompt followed by the completion shown."""

    def reset(self) -> None:
        """Forget everything learned and counted so far (cold-start measurements). Rebinds its state
        rather than clearing it in place: a `fresh` copy shares nothing mutable with its original."""

    def fresh(self) -> DraftSource:
        """A copy that shares what is read-only (weights, tables) but has learned nothing yet: the
        speculative benchmark gives each method sources of its own."""
        clone = copy.copy(self)
        clone.reset()
        return clone

    def stats(self) -> dict:
        """Figures of its own for the engine status (merged into the speculative section)."""
        return {}


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
