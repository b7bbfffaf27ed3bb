"""The lookahead cache: the rest of recent suggestions, and confident hints, drafted when the text
gets back to them."""

from memosight.engine.decoding.verify import Candidate
from memosight.engine.drafts import DraftState, StepOutcome
from memosight.engine.drafts.lookahead import LookaheadCache


def test_a_finished_suggestion_is_drafted_when_the_user_types_its_start():
    lookahead = LookaheadCache()
    prompt_end, completion = [1, 2, 3], [10, 11, 12, 13, 14]
    lookahead.finish(prompt_end + completion)
    # The user typed the first two tokens of the suggestion; the next request's context ends there.
    (draft,) = lookahead.propose(DraftState([9, 3, 10, 11], None, 4, max_len=8))
    assert draft.tokens == [12, 13, 14] and draft.source == "lookahead" and not draft.hint
    assert lookahead.propose(DraftState([9, 3, 10, 11], None, 4, max_len=2))[0].tokens == [12, 13]  # budget
    assert lookahead.propose(DraftState([7, 8, 9], None, 3, max_len=8)) == []  # nothing like it seen


def test_the_most_recent_sequences_are_asked_first_and_old_ones_fall_out():
    lookahead = LookaheadCache(max_sequences=2)
    lookahead.finish([1, 2, 3, 4, 5])
    lookahead.finish([1, 2, 3, 6, 7])
    assert [c.tokens for c in lookahead.propose(DraftState([1, 2, 3], None, 3))] == [[6, 7], [4, 5]]
    lookahead.finish([8, 8, 8, 8])
    assert [c.tokens for c in lookahead.propose(DraftState([1, 2, 3], None, 3))] == [[6, 7]]


def test_reset_forgets_everything():
    lookahead = LookaheadCache()
    lookahead.finish([1, 2, 3, 4, 5])
    lookahead.reset()
    assert lookahead.propose(DraftState([1, 2, 3], None, 3)) == []


def test_the_heads_confident_guesses_reach_the_lookahead_cache_through_observe():
    lookahead = LookaheadCache()
    state = DraftState([5, 6, 7, 8, 9], None, 5, max_len=8)
    hint = Candidate([10, 11, 12], "heads", hint=True)
    lookahead.observe(StepOutcome(state, {"heads": [hint]}, [], 10, verified=True))
    assert lookahead.propose(DraftState([1, 7, 8, 9], None, 4, max_len=8))[0].tokens == [10, 11, 12]
    lookahead.observe(StepOutcome(state, {"heads": [Candidate([13], "heads")]}, [], 13, verified=True))
    assert len(lookahead.sequences) == 1  # drafts are not hints: only hints are kept


def test_hints_of_a_plain_step_are_not_kept():
    lookahead = LookaheadCache()
    state = DraftState([5, 6, 7, 8, 9], None, 5, max_len=8)
    lookahead.observe(StepOutcome(state, {"heads": [Candidate([10, 11], "heads", hint=True)]}, [], 10, verified=False))
    assert not lookahead.sequences
