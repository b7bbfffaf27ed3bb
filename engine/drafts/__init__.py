"""Draft sources behind one small interface, and the list of them.

Each step of the speculative loop asks every source to `propose` continuations, verifies them all
at once, then tells every source what was accepted (`observe`). A new draft source is one class
here in drafts/ and one entry in SOURCES.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..verify import Candidate


@dataclass
class DraftState:
    """What a draft source may look at to guess the tokens after `context`."""

    context: list[int]  # prompt + accepted tokens + the certain next (root) token
    hidden: torch.Tensor | None = None  # (H,) base model's last hidden state before the root token
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
        """Forget everything learned from earlier requests (cold-start measurements)."""

    def stats(self) -> dict:
        """Figures of its own for the engine status (merged into the speculative section)."""
        return {}


def build_drafters(model, model_dir: Path | None) -> list[DraftSource]:
    """Every source that can draft for `model`, in the order they are asked (standby ones last)."""
    from .heads import HeadDrafter
    from .lookahead import LookaheadCache
    from .ngram import NgramDrafter, TableDrafter

    # The cheap sources first; among standby sources, the corpus table before the heads.
    sources: list[type[DraftSource]] = [NgramDrafter, LookaheadCache, TableDrafter, HeadDrafter]
    drafters = [source.for_model(model, model_dir) for source in sources]
    return [d for d in drafters if d is not None]


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
