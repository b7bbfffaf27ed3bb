"""The draft-source interface: its defaults, `fresh` copies that share read-only parts but no
learned state, and the per-source drafted/accepted counts."""

import pytest
from memosight.engine.decoding.verify import Candidate
from memosight.engine.drafts.base import DraftSource, DraftState, DraftStats


class Remembering(DraftSource):
    """A source with a read-only table and state it learns, as the real ones have."""

    name = "remembering"

    def __init__(self, table):
        self.table = table
        self.seen: list[list[int]] = []

    def propose(self, state):
        return [Candidate(self.table.get(state.context[-1], []), self.name)]

    def finish(self, tokens):
        self.seen.append(tokens)

    def reset(self):
        self.seen = []  # rebound, not cleared: the original keeps what it learned


def test_a_source_without_propose_cannot_draft_and_the_rest_is_optional():
    source = DraftSource.for_model(model=None, model_dir=None)
    assert type(source) is DraftSource and source.name == "source" and source.standby is False
    with pytest.raises(NotImplementedError):
        source.propose(DraftState([1, 2]))
    assert source.stats() == {}


def test_for_model_builds_the_subclass_it_is_called_on():
    class Plain(DraftSource):
        name = "plain"

    assert type(Plain.for_model(None, None)) is Plain


def test_a_draft_state_drafts_at_most_eight_tokens_unless_told():
    state = DraftState([5, 6, 7])
    assert (state.hidden, state.prompt_len, state.max_len) == (None, 0, 8)


def test_fresh_shares_the_table_but_nothing_learned():
    table = {3: [4, 5]}
    original = Remembering(table)
    original.finish([1, 2, 3])
    clone = original.fresh()
    assert clone is not original and type(clone) is Remembering
    assert clone.table is original.table  # weights and tables are not copied
    assert clone.seen == [] and original.seen == [[1, 2, 3]]
    clone.finish([9])
    assert original.seen == [[1, 2, 3]]  # the clone's learning stays its own
    assert clone.propose(DraftState([3]))[0].tokens == [4, 5]


def test_stats_add_up_per_source_and_report_sorted_rates():
    stats = DraftStats()
    stats.add("ngram", drafted=10, accepted=4)
    stats.add("ngram", drafted=6, accepted=2)
    stats.add("heads", drafted=3)
    stats.add("table", accepted=1)  # accepted with nothing counted as drafted: no rate to divide
    stats.add("lookahead", drafted=3, accepted=1)
    out = stats.to_json()
    assert list(out) == ["heads", "lookahead", "ngram", "table"]
    assert out == {"heads": {"drafted": 3, "accepted": 0, "rate": 0.0},
                   "lookahead": {"drafted": 3, "accepted": 1, "rate": 0.3333},
                   "ngram": {"drafted": 16, "accepted": 6, "rate": 0.375},
                   "table": {"drafted": 0, "accepted": 1, "rate": 0.0}}


def test_two_stats_share_no_counts():
    a, b = DraftStats(), DraftStats()
    a.add("ngram", 5, 5)
    assert b.to_json() == {} and a.to_json()["ngram"]["rate"] == 1.0
