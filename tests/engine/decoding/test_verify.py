import torch
from memosight.engine.decoding.verify import Candidate, accept_longest_path, build_tree, tree_attention_mask


def test_candidates_merge_into_a_tree_sharing_prefixes():
    tree = build_tree(7, [Candidate([1, 2, 3], "heads", 0.9), Candidate([1, 4], "ngram", 0.5)], 10, 8)
    assert tree.tokens == [7, 1, 2, 3, 4]
    assert tree.parents == [-1, 0, 1, 2, 1]
    assert tree.depths == [0, 1, 2, 3, 2]
    assert tree.sources == ["greedy", "heads", "heads", "heads", "ngram"]


def test_tree_respects_node_and_depth_limits():
    tree = build_tree(0, [Candidate([1, 2, 3, 4], "a"), Candidate([5, 6], "b", 0.5)], max_nodes=4, max_depth=2)
    assert tree.tokens == [0, 1, 2, 5]


def test_mask_lets_each_node_see_only_its_ancestors():
    tree = build_tree(7, [Candidate([1, 2], "x"), Candidate([3], "y", 0.5)], 10, 8)  # 7 -> 1 -> 2, 7 -> 3
    mask = tree_attention_mask(tree, past=2, dtype=torch.float32, device="cpu")[0, 0]
    visible = (mask == 0).int().tolist()
    assert visible == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]
    assert mask.min() == torch.finfo(torch.float32).min  # additive and finite: no NaN from -inf


def test_accept_follows_greedy_choices_while_the_tree_has_them():
    tree = build_tree(7, [Candidate([1, 2], "x"), Candidate([3, 9], "y", 0.5)], 10, 8)
    # nodes: 0:7, 1:1, 2:2, 3:3, 4:9. Greedy after 7 is 3, after 3 is 9, after 9 is 5 (not drafted).
    greedy_next = [3, 0, 0, 9, 5]
    assert accept_longest_path(tree, greedy_next) == [0, 3, 4]
    assert accept_longest_path(tree, [8, 0, 0, 0, 0]) == [0]


def test_the_greedy_choice_can_be_asked_along_the_path_only():
    tree = build_tree(7, [Candidate([1, 2], "x"), Candidate([3, 9], "y", 0.5)], 10, 8)
    asked = []

    def greedy_next(node: int) -> int:
        asked.append(node)
        return [3, 0, 0, 9, 5][node]

    assert accept_longest_path(tree, greedy_next) == [0, 3, 4]
    assert asked == [0, 3, 4]  # nodes 1 and 2 were never computed
