"""N-gram drafts: the prompt lookup and the corpus table (counting, backoff, pruning, chains, file)."""

import numpy as np

from memosight.engine.drafts import DraftState
from memosight.engine.drafts.ngram import NgramTable, TableDrafter, lookup


def test_prompt_lookup_returns_what_followed_the_tail_most_recent_first():
    tokens = [1, 2, 3, 9, 9, 1, 2, 4, 8, 8, 1, 2]
    assert lookup(tokens, [1, 2], max_len=2, max_matches=2, search_end=len(tokens)) == [[4, 8], [3, 9]]


def test_table_guesses_the_most_frequent_next_token_and_its_share():
    # After 5: 6 three times, 7 once.
    tokens = np.array([5, 6, 0, 5, 6, 0, 5, 6, 0, 5, 7, 0])
    table = NgramTable.build(tokens, max_order=2, min_count=1)
    assert table.guess([1, 5]) == (6, 0.75)
    assert table.guess([42]) is None  # a token never seen has no guess


def test_a_longer_context_wins_over_its_tail_and_unknown_ones_back_off():
    # After "3 5" comes 9 (twice), after "4 5" comes 6 (three times): 5 alone says 6.
    tokens = np.array([3, 5, 9, 0, 3, 5, 9, 0, 4, 5, 6, 0, 4, 5, 6, 0, 4, 5, 6, 0])
    table = NgramTable.build(tokens, max_order=2, min_count=2)
    assert table.guess([3, 5])[0] == 9
    assert table.guess([4, 5])[0] == 6
    assert table.guess([8, 5])[0] == 6  # "8 5" never seen: the one-token tail answers


def test_contexts_that_guess_like_their_tail_or_are_rare_are_not_stored():
    tokens = np.array([3, 5, 6, 0, 4, 5, 6, 0, 4, 5, 6, 0, 2, 5, 7, 0])
    table = NgramTable.build(tokens, max_order=2, min_count=2)
    two_token = table.orders[2][0]
    assert len(two_token) == 0  # "4 5" -> 6 is what "5" says; "3 5" and "2 5" were seen once
    assert table.guess([4, 5])[0] == 6


def test_a_corpus_too_small_for_the_count_floor_gives_an_empty_table():
    table = NgramTable.build(np.array([1, 2, 3, 4, 5]), max_order=4, min_count=3)
    assert len(table) == 0 and table.guess([1, 2, 3]) is None


def test_table_file_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=5000)
    table = NgramTable.build(tokens, max_order=3, min_count=2)
    table.save(tmp_path)
    loaded = NgramTable.load(tmp_path)
    assert len(loaded) == len(table) > 0
    for start in range(0, 4000, 97):
        context = tokens[start:start + 5].tolist()
        assert loaded.guess(context) == table.guess(context)
    assert NgramTable.load(tmp_path / "nowhere") is None


def test_drafter_chains_guesses_while_their_joint_share_holds():
    # 1 -> 2 always, 2 -> 3 always, 3 -> 4 half the time (else 5), 4 -> 1 always.
    tokens = np.array([1, 2, 3, 4, 1, 2, 3, 5] * 10)
    table = NgramTable.build(tokens, max_order=1, min_count=1)
    state = DraftState([7, 1], None, 2, max_len=16)
    assert TableDrafter(table, max_len=8, min_joint=0.9).propose(state)[0].tokens == [2, 3]
    assert TableDrafter(table, max_len=8, min_joint=0.4).propose(state)[0].tokens[:3] == [2, 3, 4]
    assert TableDrafter(table, max_len=2, min_joint=0.0).propose(state)[0].tokens == [2, 3]
    short = DraftState([7, 1], None, 2, max_len=1)
    assert TableDrafter(table, max_len=8, min_joint=0.0).propose(short)[0].tokens == [2]
    assert TableDrafter(table).propose(DraftState([99], None, 1)) == []
