"""Draft sources behind one small interface (base.py), and the list of them.

Each step of the speculative loop asks every source to `propose` continuations, verifies them all
at once, then tells every source what was accepted (`observe`). A new draft source is one class
here in drafts/ and one entry in SOURCES.
"""

from __future__ import annotations

from pathlib import Path

from .base import DraftSource, DraftState, DraftStats, StepOutcome
from .heads import HeadDrafter
from .lookahead import LookaheadCache
from .ngram import NgramDrafter, TableDrafter

# Every source, in the order they are asked: the cheap ones first; among the standby ones (asked
# only when those before have nothing), the corpus table before the heads.
SOURCES: list[type[DraftSource]] = [NgramDrafter, LookaheadCache, TableDrafter, HeadDrafter]


def build_drafters(model, model_dir: Path | None) -> list[DraftSource]:
    """Every source that can draft for `model` (some need files beside it), in SOURCES' order."""
    drafters = [source.for_model(model, model_dir) for source in SOURCES]
    return [d for d in drafters if d is not None]


__all__ = ["SOURCES", "DraftSource", "DraftState", "DraftStats", "StepOutcome", "build_drafters"]
