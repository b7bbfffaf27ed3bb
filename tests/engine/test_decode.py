"""The speculative loop returns exactly the plain greedy tokens, in float32, on many prompts."""

import numpy as np
import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.drafts.heads import DraftHeads, HeadDrafter, HeadsConfig
from memosight.engine.drafts.ngram import NgramTable, TableDrafter

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
    "class Item:\n    def __init__(self, name):\n        self.name = name\n        self.",
    "import os\nimport sys\nimport os\n",
    "for i in range(10):\n    for j in range(10):\n        for",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,",
    "",
    "self.items[name] = self.items[name] + self.items[",
]


def with_random_heads(engine, seed: int = 0):
    """Heads with random (non-identity) weights, so the trees hold many wrong guesses as well."""
    torch.manual_seed(seed)
    heads = DraftHeads(HeadsConfig(engine.model.config.hidden_size, num_heads=4))
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.5)
    engine.heads = heads.eval()
    engine.heads_drafter = HeadDrafter(heads, engine.model.get_output_embeddings(), min_prob=0.0)  # draft every guess
    engine.drafters = [engine.heads_drafter, *engine.drafters]
    return engine


def with_corpus_table(engine):
    """A corpus table counted on the test prompts themselves, drafting whenever the prompt has no match."""
    tokens = np.array([t for prompt in PROMPTS for t in engine.encode(prompt) + [0]])
    engine.table_drafter = TableDrafter(NgramTable.build(tokens, max_order=3, min_count=1), min_joint=0.0)
    engine.drafters = [*engine.drafters, engine.table_drafter]
    return engine


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_speculative_equals_plain_greedy(tiny_models, arch):
    engine = with_corpus_table(with_random_heads(load_engine(str(tiny_models[arch]), device="cpu")))
    for prompt in PROMPTS:
        ids = engine.prompt_ids(prompt, "\n    return total\n")
        for limit in (1, 2, 5, 40):
            plain = engine.generate(ids, limit, speculative=False)
            assert engine.generate(ids, limit, speculative=True) == plain, (prompt, limit)
    stats = engine.spec_stats.to_json()
    assert stats["steps"] > 0 and stats["sources"]["heads"]["drafted"] > 0
    assert stats["sources"]["table"]["drafted"] > 0


def test_eos_inside_an_accepted_draft_ends_generation(repeater_model_dir):
    engine = load_engine(str(repeater_model_dir), device="cpu")
    ids = engine.encode("x = 1\n")
    # The repeater emits "x" forever; make "x" an end token so the very first token is EOS.
    x = engine.encode("x")[0]
    engine.eos_ids = {x}
    assert engine.generate(ids, 30) == [x] == engine.generate(ids, 30, speculative=False)


def test_drafts_are_accepted_many_tokens_per_step(repeater_model_dir):
    engine = load_engine(str(repeater_model_dir), device="cpu")
    ids = engine.encode("xxxxxxxxxxxx = 1\n")
    out = engine.generate(ids, 60)
    assert out == engine.generate(ids, 60, speculative=False)
    stats = engine.spec_stats.to_json()
    assert stats["tokens_per_step"] > 3  # n-gram drafts of "xxx..." are right every time
    assert stats["sources"]["ngram"]["accepted"] > 0


def test_drafts_longer_than_the_limit_are_cut(repeater_model_dir):
    engine = load_engine(str(repeater_model_dir), device="cpu")
    ids = engine.encode("xxxxxxxxxxxxxxxxxxxxxxxx")
    for limit in (3, 4, 7):
        assert len(engine.generate(ids, limit)) == limit


def test_cache_is_compacted_to_the_accepted_path(tiny_model_dir):
    engine = with_random_heads(load_engine(str(tiny_model_dir), device="cpu"))
    ids = engine.prompt_ids(PROMPTS[0], "")
    out = engine.generate(ids, 20)
    cache = engine.prompt_cache
    assert len(cache.tokens) == cache.cache.get_seq_length()
    assert cache.tokens[: len(ids)] == ids and cache.tokens[len(ids):] == out[: len(cache.tokens) - len(ids)]
    # And the cache is right, not just the right length: continuing from it matches a fresh run.
    fresh = load_engine(str(tiny_model_dir), device="cpu")
    longer = ids + out
    assert engine.generate(longer, 10, speculative=False) == fresh.generate(longer, 10, speculative=False)


def test_head_drafts_below_the_probability_floor_are_not_proposed(tiny_model_dir):
    from memosight.engine.drafts import DraftState

    engine = with_random_heads(load_engine(str(tiny_model_dir), device="cpu"))
    drafter = engine.heads_drafter
    state = DraftState([1, 2, 3], torch.randn(engine.model.config.hidden_size), 3, max_len=8)
    everything = drafter.propose(state)
    drafter.min_prob = 0.5
    kept = drafter.propose(state)
    assert len(kept) < len(everything)
    assert all(c.score >= 0.5 for c in kept)
    drafter.min_prob = 1.01
    assert drafter.propose(state) == []


def _stream(pieces: list[str], stop, started: float, delay_s: float = 0.0):
    """stream_text over `pieces` as if each were a token, `delay_s` apart."""
    import time as _time

    from memosight.engine.decode import StreamState, stream_text

    def tokens():
        for i in range(len(pieces)):
            _time.sleep(delay_s)
            yield i

    state = StreamState(started=started)
    text = "".join(stream_text(tokens(), lambda ids: "".join(pieces[i] for i in ids), stop, set(), state))
    return text, state


def test_a_multi_line_completion_over_its_time_budget_ends_at_its_last_complete_line():
    import time as _time

    from memosight.engine.request import StopRule

    pieces = ["    a = 1", "\n", "    b = ", "2", "\n", "    c = 3", "\n"]
    budget = StopRule(block_indent=0, time_budget_ms=1.0)
    text, state = _stream(pieces, budget, started=_time.perf_counter() - 1.0)  # already over
    assert (text, state.stop_reason) == ("    a = 1", "time_budget")
    relaxed = StopRule(block_indent=0, time_budget_ms=60_000.0)
    text, state = _stream(pieces, relaxed, started=_time.perf_counter())
    assert text == "    a = 1\n    b = 2\n    c = 3\n" and state.stop_reason == "max_tokens"
    single = StopRule(single_line=True, time_budget_ms=1.0)  # single lines are short: no budget
    text, state = _stream(pieces, single, started=_time.perf_counter() - 1.0)
    assert (text, state.stop_reason) == ("    a = 1", "newline")


def test_a_source_that_costs_more_time_than_its_tokens_save_is_paused():
    from memosight.engine.decode import DraftController

    controller = DraftController(min_asks=4, source_backoff=10)
    controller.record_step(0.010, 2)  # 5 ms a token
    for _ in range(4):
        controller.update_ask("dear", seconds=0.004, accepted=0)  # 4 ms an ask, nothing accepted
        controller.update_ask("cheap", seconds=0.0001, accepted=2)
    assert not controller.allows("dear")
    assert controller.allows("cheap")


def test_a_cheap_source_is_not_paused_for_asks_that_found_nothing():
    from memosight.engine.decode import DraftController

    controller = DraftController(min_asks=4)
    controller.record_step(0.010, 2)
    for _ in range(20):
        controller.update_ask("lookup", seconds=0.00005, accepted=0)
    assert controller.allows("lookup")


def test_a_source_that_keeps_losing_time_waits_longer_each_time():
    from memosight.engine.decode import DraftController

    controller = DraftController(min_asks=2, source_backoff=4)
    controller.record_step(0.010, 2)
    pauses = []
    for _ in range(3):
        for _ in range(2):
            controller.update_ask("dear", seconds=0.004, accepted=0)
        pauses.append(controller.source_pause["dear"])
        controller.source_pause["dear"] = 0  # the pause is over
    assert pauses == [4, 8, 16]


def test_plain_fallback_comes_after_a_few_full_trees_miss_but_not_after_as_many_cheap_guesses():
    from memosight.engine.decode import DraftController

    full = DraftController(max_nodes=16, patience=4, backoff=8)
    for _ in range(4):
        assert full.use_drafts()
        full.update(0, drafted_nodes=16)
    assert not full.use_drafts()  # backed off to plain decoding

    cheap = DraftController(max_nodes=16, patience=4, backoff=8)
    for _ in range(4):
        assert cheap.use_drafts()
        cheap.update(0, drafted_nodes=2)  # a two-token guess that missed costs an eighth of a full tree
    assert cheap.use_drafts()
    for _ in range(28):
        cheap.update(0, drafted_nodes=2)
    assert not cheap.use_drafts()
