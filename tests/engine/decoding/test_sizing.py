"""Tree sizing: the nodes that pay for their rows, from measured pass costs and calibrated
probabilities."""

from memosight.engine.decoding.sizing import Calibration, PassCost, TreeSizer
from memosight.engine.decoding.verify import Candidate, build_tree


def sizer_with(costs: dict[int, float]) -> TreeSizer:
    sizer = TreeSizer(max_rows=16, explore_every=0)
    for rows, ms in costs.items():
        sizer.cost.record(rows, ms)
    return sizer


def tree_of(*candidates: tuple[list[int], float, str]):
    return build_tree(0, [Candidate(tokens, source, score) for tokens, score, source in candidates],
                      max_nodes=64, max_depth=16)


def test_pass_cost_is_interpolated_between_measured_sizes_and_extrapolated_beyond():
    cost = PassCost()
    cost.record(1, 10.0)
    cost.record(4, 16.0)
    assert cost(1) == 10.0 and cost(2) == 12.0 and cost(4) == 16.0
    assert cost(8) == 32.0  # beyond the last measured size: in proportion
    assert cost.size_of(5) == 6 and cost.size_of(100) == 32
    cost.record(1, 20.0)  # a new pass moves the running figure part of the way
    assert 10.0 < cost(1) < 20.0


def test_when_rows_are_nearly_free_every_likely_node_is_kept():
    sizer = sizer_with({1: 30, 2: 30.5, 4: 31, 8: 33, 16: 40})
    tree = tree_of(([1, 2, 3, 4], 0.6, "heads"), ([5, 6], 0.3, "heads"))
    assert sizer.choose(tree) == list(range(len(tree)))


def test_when_each_row_costs_a_token_only_near_certain_nodes_are_kept():
    sizer = sizer_with({1: 10, 2: 18, 4: 34, 8: 70, 16: 150})
    tree = tree_of(([1, 2], 0.6, "heads"), ([5], 0.3, "heads"))
    assert sizer.choose(tree) == [0]  # a plain step: no node is worth a whole token's time
    sure = tree_of(([1, 2], 1.0, "ngram"))
    assert sizer.choose(sure) == [0, 1, 2]


def test_the_chosen_nodes_always_include_their_parents():
    sizer = sizer_with({1: 10, 2: 10.5, 3: 11, 4: 30})  # three rows are cheap, a fourth is not
    tree = tree_of(([1, 2, 3], 0.9, "ngram"), ([7], 0.5, "heads"))
    keep = sizer.choose(tree)
    assert keep == [0, 1, 2]
    assert all(tree.parents[node] in keep for node in keep[1:])


def test_a_source_whose_nodes_are_rejected_loses_trust_at_that_depth():
    sizer = sizer_with({1: 10, 2: 11, 4: 12})
    tree = tree_of(([1, 2], 0.9, "ngram"))
    before = sizer.probabilities(tree)
    for _ in range(30):
        sizer.observe(tree, [1, 9], 2, 11.0)  # its first token right, its second wrong every time
    after = sizer.probabilities(tree)
    assert after[1] > 0.9 * before[1]
    assert after[2] < 0.3


def test_nodes_cut_from_the_pass_are_scored_too_so_trust_can_come_back():
    sizer = sizer_with({1: 10, 2: 18, 4: 34})
    tree = tree_of(([1, 2], 0.4, "draft"))
    assert sizer.choose(tree) == [0]  # not worth a row at its own word
    for _ in range(30):
        sizer.observe(tree, [1], 1, 10.0)  # a plain step: greedy went on with 1, as the draft said
    assert sizer.choose(tree)[:2] == [0, 1]
    before = sizer.calibration.probability("draft", 2, 0.4)
    sizer.observe(tree, [1], 1, 10.0)  # what greedy does after 1 is not known: depth 2 not scored
    assert sizer.calibration.probability("draft", 2, 0.4) == before


def test_calibration_starts_at_the_sources_own_word_and_learns_per_score_band():
    calibration = Calibration()
    assert calibration.probability("heads", 1, 0.3) == 0.3
    for _ in range(50):
        calibration.record("draft", 1, 1e-8, accepted=True)  # tiny scores, always right
        calibration.record("draft", 1, 0.9, accepted=False)  # confident, always wrong
    assert calibration.probability("draft", 1, 2e-8) > 0.9
    assert calibration.probability("draft", 1, 0.9) < 0.1
    assert calibration.probability("draft", 2, 2e-8) < 0.01  # another depth: nothing learnt yet


def test_now_and_then_a_pass_carries_more_nodes_than_pay_so_their_figures_stay_measured():
    sizer = TreeSizer(max_rows=16, explore_every=4)
    for rows, ms in {1: 10, 2: 18, 4: 34, 8: 70, 16: 150}.items():
        sizer.cost.record(rows, ms)
    tree = tree_of(([1, 2, 3, 4, 5, 6], 0.4, "draft"))
    chosen = [len(sizer.choose(tree)) for _ in range(8)]
    assert chosen == [1, 1, 1, 5, 1, 1, 1, 5]  # a plain step pays; every fourth verifies 4 nodes anyway
