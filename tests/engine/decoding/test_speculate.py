"""The speculative loop returns exactly the plain greedy tokens, in float32, on many prompts; its
steps call every draft source; its controller decides how much to draft."""

import numpy as np
import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.decoding.speculate import DraftController, Speculator
from memosight.engine.decoding.verify import Candidate
from memosight.engine.drafts import DraftSource, DraftState, StepOutcome
from memosight.engine.drafts.head_layers import DraftHeads
from memosight.engine.drafts.heads import HeadDrafter
from memosight.engine.drafts.heads_files import HeadsConfig
from memosight.engine.drafts.ngram import NgramTable, TableDrafter

from ...conftest import verify_everything

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
    drafter = HeadDrafter(heads.eval(), engine.model.get_output_embeddings(), min_prob=0.0)  # draft every guess
    engine.speculator = verify_everything(Speculator([drafter, *engine.speculator.drafters]))
    return engine



def with_corpus_table(engine):
    """A corpus table counted on the test prompts themselves, drafting whenever the prompt has no match."""
    tokens = np.array([t for prompt in PROMPTS for t in engine.encode(prompt) + [0]])
    table = TableDrafter(NgramTable.build(tokens, max_order=3, min_count=1), min_joint=0.0)
    table.standby = False  # asked at every step, beside the heads (standby, it waits for them to have nothing)
    engine.speculator = verify_everything(Speculator([*engine.speculator.drafters, table]))
    return engine


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_speculative_equals_plain_greedy(tiny_models, arch):
    engine = with_corpus_table(with_random_heads(load_engine(str(tiny_models[arch]), device="cpu")))
    for prompt in PROMPTS:
        ids = engine.prompt_ids(prompt, "\n    return total\n")
        for limit in (1, 2, 5, 40):
            plain = engine.generate(ids, limit, speculative=False)
            assert engine.generate(ids, limit, speculative=True) == plain, (prompt, limit)
    stats = engine.speculator.to_json()
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
    verify_everything(engine.speculator)
    ids = engine.encode("xxxxxxxxxxxx = 1\n")
    out = engine.generate(ids, 60)
    assert out == engine.generate(ids, 60, speculative=False)
    stats = engine.speculator.to_json()
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
    engine = with_random_heads(load_engine(str(tiny_model_dir), device="cpu"))
    drafter = engine.speculator.drafter("heads")
    state = DraftState([1, 2, 3], torch.randn(engine.model.config.hidden_size), 3, max_len=8)
    drafts = lambda: [c for c in drafter.propose(state) if not c.hint]  # noqa: E731
    everything = drafts()
    drafter.min_prob = 0.5
    kept = drafts()
    assert len(kept) < len(everything)
    assert all(c.score >= 0.5 for c in kept)
    drafter.min_prob = 1.01
    assert drafts() == []


def test_a_source_that_costs_more_time_than_its_tokens_save_is_paused():
    controller = DraftController(min_asks=4, source_backoff=10)
    controller.record_step(0.010, 2)  # 5 ms a token
    for _ in range(4):
        controller.update_ask("dear", seconds=0.004, accepted=0)  # 4 ms an ask, nothing accepted
        controller.update_ask("cheap", seconds=0.0001, accepted=2)
    assert not controller.allows("dear")
    assert controller.allows("cheap")


def test_a_cheap_source_is_not_paused_for_asks_that_found_nothing():
    controller = DraftController(min_asks=4)
    controller.record_step(0.010, 2)
    for _ in range(20):
        controller.update_ask("lookup", seconds=0.00005, accepted=0)
    assert controller.allows("lookup")


def test_a_source_that_keeps_losing_time_waits_longer_each_time():
    controller = DraftController(min_asks=2, source_backoff=4)
    controller.record_step(0.010, 2)
    pauses = []
    for _ in range(3):
        for _ in range(2):
            controller.update_ask("dear", seconds=0.004, accepted=0)
        pauses.append(controller.source_pause["dear"])
        controller.source_pause["dear"] = 0  # the pause is over
    assert pauses == [4, 8, 16]


def test_steps_go_plain_while_drafted_steps_make_tokens_slower_with_a_drafted_one_now_and_then():
    controller = DraftController(explore_every=4)
    controller.record_step(0.003, 1, drafted=False)  # 3 ms a plain token
    controller.record_step(0.010, 2, drafted=True)  # 5 ms a token with drafts
    assert not controller.drafts_pay()
    # each drafted step that finds drafts still losing doubles the wait for the next
    drafted = [i for i in range(1, 29) if controller.use_drafts()]
    assert drafted == [4, 12, 28]
    for _ in range(30):  # drafts start paying (a repetitive file): a miss, then a hit of 7 tokens
        controller.record_step(0.008, 1, drafted=True)
        controller.record_step(0.008, 7, drafted=True)  # 2 ms a token over both (per step: 4.6 on average)
    assert controller.drafts_pay()  # now mostly drafted steps, a plain one now and then to compare
    controller.plain_run = 0
    assert [controller.use_drafts() for _ in range(32)] == ([True] * 15 + [False]) * 2


def test_a_new_request_keeps_what_the_controller_learnt():
    controller = DraftController()
    controller.record_step(0.003, 1, drafted=False)
    controller.reset()
    assert controller.plain_ms_per_token == 3.0


def test_the_first_drafted_step_measures_the_pass_sizes_and_the_output_layer(tiny_model_dir):
    engine = with_random_heads(load_engine(str(tiny_model_dir), device="cpu"))
    engine.speculator.controller.explore_every = 1
    ids = engine.prompt_ids(PROMPTS[0], "")
    assert engine.generate(ids, 12) == engine.generate(ids, 12, speculative=False)
    speculator = engine.speculator
    assert not speculator.sizer.cost.missing() and speculator.batch_rows >= 1
    assert set(speculator.to_json()["pass_ms"]) == {str(s) for s in speculator.sizer.cost.sizes}


class Recorder(DraftSource):
    """A draft source that guesses a fixed continuation and records every call it gets."""

    name = "recorder"

    def __init__(self, guess: list[int]):
        self.guess, self.asked, self.outcomes, self.finished = guess, 0, [], []

    def propose(self, state: DraftState) -> list[Candidate]:
        self.asked += 1
        return [Candidate(self.guess[: state.max_len], self.name, score=0.95)]

    def observe(self, outcome: StepOutcome) -> None:
        self.outcomes.append(outcome)

    def finish(self, tokens: list[int]) -> None:
        self.finished.append(tokens)


def test_a_new_source_is_one_class_in_the_list_and_observes_every_step(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    ids = engine.prompt_ids(PROMPTS[1], "")
    plain = engine.generate(ids, 30, speculative=False)
    recorder = Recorder(plain[1:9])  # right for a while after the first token, then wrong
    engine.speculator = verify_everything(Speculator([recorder, *engine.speculator.drafters]))
    assert engine.generate(ids, 30) == plain
    stats = engine.speculator.to_json()
    assert stats["sources"]["recorder"]["accepted"] >= 7  # its right guesses were taken in one step
    assert len(recorder.outcomes) == stats["steps"]  # observe: every step, asked or not
    first = recorder.outcomes[0]
    assert first.verified and first.accepted == plain[1:1 + len(first.accepted)]
    assert first.next_token == plain[1 + len(first.accepted)]
    assert recorder.asked <= stats["steps"]


def test_hints_are_not_drafted_into_the_tree():
    from memosight.engine.decoding.verify import build_tree

    tree = build_tree(1, [Candidate([2, 3], "heads", hint=True), Candidate([4], "ngram")], max_nodes=8, max_depth=8)
    assert tree.tokens == [1, 4]


def test_a_finished_request_reaches_every_source(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    recorder = Recorder([])
    engine.speculator = Speculator([recorder, *engine.speculator.drafters])
    completion = engine.complete("def add(a, b):\n    return", "", max_new_tokens=6)
    (tokens,) = recorder.finished
    assert engine.decode(tokens).endswith(completion.text)
