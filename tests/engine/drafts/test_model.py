"""The draft-model source: a small model with the target's tokenizer drafts, the target verifies;
the output is greedy's whatever the draft guesses, and a draft that agrees is accepted whole."""

from __future__ import annotations

import pytest
from memosight.engine import load_engine
from memosight.engine.decoding.speculate import Speculator
from memosight.engine.drafts.model import DraftModel
from memosight.engine.loading.torch_load import ModelLoadError

from ...conftest import build_repeater_model, build_tiny_model, build_tokenizer, verify_everything

PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def __init__(self, x, y):\n        self.", "import os\n\n"]


def bold(engine) -> DraftModel:
    """The engine's draft source, made to draft the longest chains with branches (tiny random
    models are never sure of anything)."""
    draft = engine.speculator.drafter("draft_model")
    draft.threshold = draft.start_threshold = draft.min_threshold = 0.0
    return draft


def test_decoding_with_a_draft_model_is_exactly_greedy(tiny_model_dir, tmp_path):
    draft_dir = build_tiny_model(tmp_path / "draft", "llama", seed=1)
    engine = load_engine(str(tiny_model_dir), draft_model=str(draft_dir))
    bold(engine)
    verify_everything(engine.speculator)
    for text in PROMPTS:
        ids = engine.tokenizer.encode(text)
        assert engine.generate(ids, 24, speculative=True) == engine.generate(ids, 24, speculative=False)
    counts = engine.speculator.stats.drafts.to_json()["draft_model"]
    assert counts["drafted"] > 0


def test_a_draft_that_agrees_with_the_target_is_accepted_whole(tmp_path):
    target = build_repeater_model(tmp_path / "target")
    engine = load_engine(str(target), draft_model=str(build_repeater_model(tmp_path / "draft")))
    draft = bold(engine)
    draft.branch_below = 0.0  # chains only: the repeater's choice is clear, if never confident
    engine.speculator = verify_everything(Speculator([draft]))  # the draft alone
    ids = engine.tokenizer.encode("x = 1\n")
    for _ in range(2):  # the second time the draft's cache is reused from the first
        tokens = engine.generate(ids, 40, speculative=True)
        assert tokens == engine.generate(ids, 40, speculative=False)
    counts = engine.speculator.stats.drafts.to_json()["draft_model"]
    assert counts["drafted"] >= 40 and counts["rate"] > 0.95
    assert engine.speculator.stats.steps < 40  # several tokens per target forward


def test_a_draft_with_another_tokenizer_is_refused(tiny_model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "other", "llama")
    build_tokenizer(other, vocab_size=300)  # the same weights' shape, another vocabulary
    with pytest.raises(ModelLoadError, match="another tokenizer"):
        load_engine(str(tiny_model_dir), draft_model=str(other))


def test_the_draft_s_cache_follows_the_text_through_rejections(tiny_model_dir, tmp_path):
    from memosight.engine.drafts.base import DraftState

    engine = load_engine(str(tiny_model_dir), draft_model=str(build_tiny_model(tmp_path / "draft", seed=1)))
    draft = bold(engine)
    draft.branch_below = 0.0
    ids = engine.tokenizer.encode(PROMPTS[1])
    tokens = engine.generate(ids, 30, speculative=True)  # the draft is mostly wrong: its cache is cropped often
    state = DraftState(ids + tokens, None, len(ids), max_len=6)
    assert draft.propose(state)[0].tokens == draft.fresh().propose(state)[0].tokens  # as if from scratch


def test_a_draft_that_fails_costs_its_guesses_only(tiny_model_dir, tmp_path):
    engine = load_engine(str(tiny_model_dir), draft_model=str(build_tiny_model(tmp_path / "draft", seed=1)))
    draft = bold(engine)

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory")
    draft.runtime.prefill_hidden = out_of_memory  # fails midway through its forward pass
    ids = engine.tokenizer.encode(PROMPTS[0])
    assert engine.generate(ids, 12, speculative=True) == engine.generate(ids, 12, speculative=False)
    assert draft.runtime.prefill_hidden is not out_of_memory  # a fresh cache for the next step
