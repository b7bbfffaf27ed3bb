"""Verification of a draft tree in one forward pass: tree mask, longest greedy path, statistics.

The tree's root is the token plain greedy decoding produces next (certain); every other node is a
drafted guess. One forward pass over all nodes, each seeing only its ancestors, gives the base
model's greedy choice after every node; the accepted path follows those choices as far as the tree
has them. The result is exactly what plain greedy decoding would have produced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the mask is the torch runtime's: llama.cpp's process never imports torch
    import torch


@dataclass
class Candidate:
    tokens: list[int]  # a guessed continuation after the root token
    source: str  # "heads", "ngram", "lookahead", "table"
    score: float = 1.0  # higher first when the tree is full
    # A hint is not for this step's tree but for the sources that learn from what others proposed:
    # the heads' confident guesses, which the lookahead cache keeps for later steps.
    hint: bool = False


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # node 0 is the root
    parents: list[int] = field(default_factory=list)  # -1 for the root
    depths: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # the best score of a candidate through the node
    children: list[dict[int, int]] = field(default_factory=list)  # token -> child node

    def add(self, token: int, parent: int, source: str, score: float = 1.0) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        self.sources.append(source)
        self.scores.append(score)
        self.children.append({})
        node = len(self.tokens) - 1
        if parent >= 0:
            self.children[parent][token] = node
        return node

    def __len__(self) -> int:
        return len(self.tokens)


def build_tree(root: int, candidates: list[Candidate], max_nodes: int, max_depth: int) -> DraftTree:
    """Merge candidate continuations into one tree under `root`, best candidates first."""
    tree = DraftTree()
    tree.add(root, -1, "greedy")
    for cand in sorted(candidates, key=lambda c: -c.score):
        if cand.hint:
            continue
        node = 0
        for token in cand.tokens[:max_depth]:
            child = tree.children[node].get(token)
            if child is None:
                if len(tree) >= max_nodes:
                    break
                child = tree.add(token, node, cand.source, cand.score)
            node = child
    return tree


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The tree of the nodes `keep` (increasing, the root first, each node's parent kept too)."""
    if len(keep) == len(tree):
        return tree
    new_index = {old: new for new, old in enumerate(keep)}
    out = DraftTree()
    for old in keep:
        parent = tree.parents[old]
        out.add(tree.tokens[old], new_index[parent] if parent >= 0 else -1, tree.sources[old], tree.scores[old])
    return out


def first_chain(tree: DraftTree) -> list[int]:
    """The root, its first child, that one's first child, ...: the tree's leading chain."""
    chain = [0]
    while tree.children[chain[-1]]:
        chain.append(min(tree.children[chain[-1]].values()))
    return chain


def tree_attention_mask(tree: DraftTree, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask (1, 1, N, past + N): every node sees the cached past, its ancestors and itself."""
    import torch

    n = len(tree)
    visible = np.eye(n, dtype=bool)  # numpy rows: this runs every decoding step
    for node, parent in enumerate(tree.parents):  # parents come before children: their rows are complete
        if parent >= 0:
            visible[node] |= visible[parent]
    tree_part = torch.from_numpy(visible).to(device)
    mask = torch.zeros((n, past + n), dtype=dtype, device=device)
    mask[:, past:].masked_fill_(~tree_part, torch.finfo(dtype).min)
    return mask[None, None]


def accept_longest_path(tree: DraftTree, greedy_next: list[int] | Callable[[int], int]) -> list[int]:
    """Node indices of the accepted path: from the root, follow the child equal to the base model's
    greedy choice at each node for as long as the tree has one. `greedy_next`: that choice after
    each node, as a list, or as a function of the node, asked along the path only."""
    choice = greedy_next.__getitem__ if isinstance(greedy_next, list) else greedy_next
    path = [0]
    while (child := tree.children[path[-1]].get(choice(path[-1]))) is not None:
        path.append(child)
    return path
