"""The draft heads: separate residual blocks that start as the identity, an output layer of their
own over a reduced vocabulary, the root token as an input, saved and found beside a model."""

import json

import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.drafts.base import DraftState
from memosight.engine.drafts.heads import (CONFIG_FILE, DraftHeads, HeadDrafter, HeadsConfig, heads_folder)


def test_blocks_are_separate_modules_and_start_as_identity():
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=3, num_layers=2))
    blocks = [b for head in heads.heads for b in head]
    assert len({id(b) for b in blocks}) == 6
    x = torch.randn(2, 8)
    assert torch.equal(heads(x), torch.stack([x, x, x]))


def test_the_root_token_input_starts_ignored_and_is_required():
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2, token_input=True))
    x, token = torch.randn(8), torch.randn(8)
    assert torch.equal(heads(x, token), torch.stack([x, x]))  # zero-initialised projection
    torch.nn.init.normal_(heads.token_in.weight)
    assert not torch.equal(heads(x, token), heads(x, torch.zeros(8)))
    with pytest.raises(ValueError, match="root token"):
        heads(x)


def test_a_reduced_vocabulary_maps_columns_back_to_token_ids():
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2, vocab_size=3))
    heads.vocab_ids.copy_(torch.tensor([7, 42, 99]))
    logits = heads.logits(heads(torch.randn(8)))
    assert logits.shape == (2, 3)
    assert heads.token_ids(torch.tensor([[2, 0], [1, 1]])).tolist() == [[99, 7], [42, 42]]


def test_heads_are_saved_beside_a_model_and_loaded_back(tmp_path):
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2, vocab_size=5, token_input=True))
    torch.nn.init.normal_(heads.heads[1][0].linear.weight)
    heads.vocab_ids.copy_(torch.tensor([3, 1, 4, 15, 9]))
    heads.save(tmp_path, extra={"trained": {"steps": 3}})
    loaded = DraftHeads.load(tmp_path)
    x, token = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.equal(loaded(x, token), heads(x, token))
    assert loaded.vocab_ids.tolist() == [3, 1, 4, 15, 9]
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["trained"] == {"steps": 3}
    assert DraftHeads.load(tmp_path / "elsewhere") is None  # no heads there: nothing to draft with


def test_heads_saved_before_the_reduced_vocabulary_still_load(tmp_path):
    from safetensors.torch import save_file

    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2))
    save_file({k: v for k, v in heads.state_dict().items() if k != "vocab_ids"}, str(tmp_path / "draft_heads.safetensors"))
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"hidden_size": 8, "num_heads": 2, "num_layers": 1}))
    loaded = DraftHeads.load(tmp_path)
    assert loaded.out is None and loaded.token_in is None


def test_packaged_heads_are_found_by_the_model_folders_name(tmp_path, monkeypatch):
    from memosight.engine.drafts import heads as module

    packaged = tmp_path / "packaged"
    DraftHeads(HeadsConfig(hidden_size=8)).save(packaged / "SomeModel.Q4_1-0123abcd")
    monkeypatch.setattr(module, "PACKAGED_HEADS", packaged)
    assert heads_folder(tmp_path / "cache" / "SomeModel.Q4_1-0123abcd") == packaged / "SomeModel.Q4_1-0123abcd"
    # the dequantized folder's name as gguf.dequantized_folder writes it
    assert heads_folder(tmp_path / "cache" / "SomeModel.Q4_1-0123abcd-shards") == packaged / "SomeModel.Q4_1-0123abcd"
    assert heads_folder(tmp_path / "cache" / "SomeModel.Q4_1-ffffffff") is None  # another file: not these
    beside = tmp_path / "cache" / "SomeModel.Q4_1-0123abcd"
    DraftHeads(HeadsConfig(hidden_size=8)).save(beside)
    assert heads_folder(beside) == beside  # heads beside the model come first


def test_a_drafter_with_reduced_vocabulary_proposes_token_ids_of_the_model(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    hidden = engine.model.config.hidden_size
    heads = DraftHeads(HeadsConfig(hidden, num_heads=3, vocab_size=4, token_input=True))
    heads.vocab_ids.copy_(torch.tensor([11, 22, 33, 44]))
    torch.nn.init.normal_(heads.out.weight)
    drafter = HeadDrafter(heads.eval(), engine.model.get_output_embeddings(), engine.model.get_input_embeddings(),
                          min_prob=0.0)
    assert not drafter.standby  # cheap heads are asked every step
    proposals = drafter.propose(DraftState([5, 6, 7], torch.randn(hidden), 3, max_len=8))
    drafted = {t for c in proposals for t in c.tokens}
    assert drafted and drafted <= {11, 22, 33, 44}
    assert max(len(c.tokens) for c in proposals) == 3


def test_the_output_rows_are_the_models_own_and_are_not_saved(tmp_path):
    lm_head = torch.nn.Linear(8, 50, bias=False)
    heads = DraftHeads(HeadsConfig(hidden_size=8, num_heads=2, vocab_size=3))
    heads.vocab_ids.copy_(torch.tensor([4, 9, 30]))
    heads.attach_output(lm_head)
    assert torch.equal(heads.out.weight, lm_head.weight[[4, 9, 30]])
    assert not heads.out.weight.requires_grad
    heads.save(tmp_path, dtype=torch.bfloat16)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "draft_heads.safetensors"))
    assert "out.weight" not in stored and stored["heads.0.0.linear.weight"].dtype == torch.bfloat16
    loaded = DraftHeads.load(tmp_path)
    loaded.attach_output(lm_head)
    x = torch.randn(8)
    assert torch.allclose(loaded.logits(loaded(x)), heads.logits(heads(x)), atol=1e-2)


@pytest.mark.parametrize("int8_ms, float_ms, expect_int8", [(1.0, 2.0, True), (1.0, 1.05, False), (3.0, 1.0, False)])
def test_heads_with_their_own_output_draft_in_int8_only_where_clearly_faster(
        tiny_model_dir, tmp_path, monkeypatch, int8_ms, float_ms, expect_int8):
    from memosight.engine.drafts import heads as heads_module
    from memosight.engine.loading.int8 import is_int8

    engine = load_engine(str(tiny_model_dir), device="cpu")
    hidden = engine.model.config.hidden_size
    DraftHeads(HeadsConfig(hidden, num_heads=2, vocab_size=16)).save(tmp_path)
    timings = iter([int8_ms, float_ms])  # int8 is timed first
    monkeypatch.setattr(heads_module, "_best_ms", lambda call: (call(), next(timings))[1])
    drafter = HeadDrafter.for_model(engine.model, tmp_path)
    assert is_int8(drafter.heads) == expect_int8
