"""The draft heads: separate residual blocks that start as the identity, saved and loaded beside a model."""

import torch

from memosight.engine.drafts.heads import DraftHeads, HeadsConfig


def test_blocks_are_separate_modules_and_start_as_identity():
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=3, num_layers=2))
    blocks = [b for head in heads.heads for b in head]
    assert len({id(b) for b in blocks}) == 6
    x = torch.randn(2, 8)
    assert torch.equal(heads(x), torch.stack([x, x, x]))


def test_heads_are_saved_beside_a_model_and_loaded_back(tmp_path):
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2))
    torch.nn.init.normal_(heads.heads[1][0].linear.weight)
    heads.save(tmp_path)
    loaded = DraftHeads.load(tmp_path)
    x = torch.randn(3, 8)
    assert torch.equal(loaded(x), heads(x))
    assert DraftHeads.load(tmp_path / "elsewhere") is None  # no heads there: nothing to draft with
