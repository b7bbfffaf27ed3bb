"""Distilling a draft model from its target: the draft's config (the target, smaller), the target's
stored top-k, the embeddings the draft starts from, the loss, the agreement figure, and a whole run
(its loss falls, its top-k is computed once, its report and model card). Resuming through the
command line is tested in tests/server/commands/test_train_draft.py."""

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

from memosight.engine import load_engine
from memosight.engine.protocol import EngineError
from memosight.engine.train import draft as D


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_engine(str(tiny_model_dir), device="cpu", dtype="float32").model


@pytest.fixture
def keep_threads():
    """run_draft sets torch's thread count for the process; put it back for the tests after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def windows_of(vocab: int, rows: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_the_default_draft_is_a_fifth_of_the_layers_at_half_the_width(tiny_model_dir):
    target = AutoConfig.from_pretrained(tiny_model_dir)  # 2 layers of 64, 4 heads of 16, 2 KV heads
    config = D.draft_config(target)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size) == (1, 32, 2, 1, 16, 64)
    assert config.vocab_size == target.vocab_size  # the target's tokens
    assert config.max_position_embeddings == target.max_position_embeddings
    assert (target.num_hidden_layers, target.hidden_size) == (2, 64)  # the target's config is not touched
    logits = AutoModelForCausalLM.from_config(config)(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, target.vocab_size)  # the shapes fit together


def test_explicit_sizes_keep_the_head_size_and_scale_the_mlp(tiny_model_dir):
    target = AutoConfig.from_pretrained(tiny_model_dir)
    config = D.draft_config(target, layers=3, hidden=48)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.head_dim,
            config.intermediate_size) == (3, 48, 3, 16, 96)
    assert config.num_attention_heads % config.num_key_value_heads == 0
    with pytest.raises(EngineError, match="multiple of the target's head size 16"):
        D.draft_config(target, hidden=40)


def test_only_llama_style_targets_get_a_draft():
    with pytest.raises(EngineError, match="Llama-style"):
        D.draft_config(GPT2Config(n_embd=64, n_layer=2, n_head=4))


def test_teacher_top_k_is_the_targets_best_logits_whatever_the_batch(target):
    windows = windows_of(target.config.vocab_size, 5, 8)
    seen = []
    values, indices = D.teacher_topk(target, windows, 4, batch=2, progress=lambda *a: seen.append(a[:2]))
    best = target(input_ids=windows).logits.topk(4, dim=-1)
    assert values.dtype == torch.float16 and indices.dtype == torch.int32  # stored small
    assert values.shape == indices.shape == (5, 8, 4)
    assert torch.equal(indices.long(), best.indices)
    assert torch.allclose(values.float(), best.values, atol=1e-2)
    assert seen == [(2, 5), (4, 5), (5, 5)]


def test_a_full_width_draft_starts_with_embeddings_alike_as_the_targets(target):
    # Projected on every principal direction, the embeddings are the target's rotated: the same
    # similarities between tokens, and the same logits of one token's embedding for another.
    draft = AutoModelForCausalLM.from_config(D.draft_config(target.config, layers=1, hidden=64))
    D.init_embeddings_from_target(draft, target)
    e_d, e_t = draft.get_input_embeddings().weight, target.get_input_embeddings().weight
    assert torch.allclose(e_d @ e_d.T, e_t @ e_t.T, atol=1e-5)
    o_d, o_t = draft.get_output_embeddings().weight, target.get_output_embeddings().weight
    assert o_t is not e_t  # the tiny Llama's output layer is its own: the untied branch is what is tested
    assert torch.allclose(o_d @ e_d.T, o_t @ e_t.T, atol=1e-5)


def test_a_narrow_draft_keeps_the_embeddings_largest_directions(target):
    draft = AutoModelForCausalLM.from_config(D.draft_config(target.config))  # 32 wide
    D.init_embeddings_from_target(draft, target)
    kept = draft.get_input_embeddings().weight.norm() ** 2
    singular = torch.linalg.svdvals(target.get_input_embeddings().weight.float())
    assert torch.allclose(kept, (singular[:32] ** 2).sum(), rtol=1e-4)


def test_the_loss_is_the_cross_entropy_against_the_renormalised_top_k():
    values = torch.tensor([[[math.log(3.0), 0.0]]])  # the target: 3/4 on token 2, 1/4 on token 0
    indices = torch.tensor([[[2, 0]]])
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)]]])  # the draft: 1/8, 2/8, 5/8
    expected = -(0.75 * math.log(5 / 8) + 0.25 * math.log(1 / 8))
    assert D.distillation_loss(logits, values, indices).item() == pytest.approx(expected, rel=1e-6)
    # at its lowest (the target's entropy) where the draft is the target
    matching = torch.tensor([[[math.log(0.25), -1e4, math.log(0.75)]]])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert D.distillation_loss(matching, values, indices).item() == pytest.approx(entropy, rel=1e-5)
    # the mean over positions
    two = D.distillation_loss(torch.cat([logits, matching], 1), values.expand(1, 2, 2), indices.expand(1, 2, 2))
    assert two.item() == pytest.approx((expected + entropy) / 2, rel=1e-5)


def test_agreement_is_the_share_of_positions_where_the_greedy_tokens_match(target):
    windows = windows_of(target.config.vocab_size, 4, 8, seed=1)
    _, greedy = D.teacher_topk(target, windows, 1)
    assert D.agreement(target, greedy, windows, batch=3) == 1.0  # the target agrees with itself
    half = greedy.clone()
    half[:, :4] = (half[:, :4] + 1) % target.config.vocab_size
    assert D.agreement(target, half, windows, batch=3) == 0.5


def test_a_run_lowers_the_loss_reports_it_and_computes_the_top_k_once(tmp_path, tiny_model_dir, code_corpus,
                                                                      monkeypatch, keep_threads):
    out = tmp_path / "run"
    cfg = D.DraftTrainConfig(seq_len=32, batch=4, steps=100, lr=3e-3, warmup=4, top_k=4, checkpoint_every=1000)
    report = D.run_draft(str(tiny_model_dir), out, cfg, corpus_specs=[str(code_corpus)], threads=1,
                         command="memosight train draft --steps 100", log=lambda line: None)
    losses = torch.load(out / D.CHECKPOINT_FILE, weights_only=False)["state"]["losses"]
    assert len(losses) == 100 and report["final_loss"] == losses[-1]
    assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:5]) / 5  # it learns the target's distribution
    assert (report["steps"], report["layers"], report["hidden"], report["seq_len"]) == (100, 1, 32, 32)
    assert report["parameters"] < report["target_parameters"] and 0.0 <= report["heldout_greedy_agreement"] <= 1.0
    assert json.loads((out / "draft_report.json").read_text()) == report
    stored = torch.load(out / D.TEACHER_FILE, weights_only=True)
    assert tuple(stored["indices"].shape) == (report["windows"], 32, 4)
    saved = AutoModelForCausalLM.from_pretrained(report["saved_to"])
    assert saved.dtype == torch.bfloat16 and saved.config.hidden_size == 32
    assert sum(p.numel() for p in saved.parameters()) == report["parameters"]
    assert (out / "draft" / "tokenizer.json").is_file()  # the target's tokenizer beside it
    assert "`memosight train draft --steps 100`" in (out / "draft" / "README.md").read_text()

    # Again on the same corpus: the stored top-k is read, the target runs only on held-out windows.
    asked = []
    real = D.teacher_topk
    monkeypatch.setattr(D, "teacher_topk", lambda model, windows, k, **kw: asked.append(k) or real(model, windows, k,
                                                                                                   **kw))
    lines = []
    D.run_draft(str(tiny_model_dir), out, D.DraftTrainConfig(seq_len=32, batch=4, steps=2, top_k=4),
                corpus_specs=[str(code_corpus)], threads=1, log=lines.append)
    assert asked == [1] and any(line.startswith("reusing the target's top-4") for line in lines)


def test_resuming_needs_a_checkpoint(tmp_path):
    with pytest.raises(EngineError, match="nothing to resume"):
        D.run_draft(None, tmp_path, D.DraftTrainConfig(), resume=True, log=lambda line: None)


def test_the_model_card_gives_the_size_data_training_and_agreement():
    report = {"target": "org/base", "parameters": 1_500_000, "target_parameters": 15_000_000, "layers": 2,
              "hidden": 128, "corpus": ["stdlib", "/src"], "windows": 300, "seq_len": 256, "steps": 600,
              "train_seconds": 81.5, "final_loss": 1.234, "heldout_greedy_agreement": 0.61, "dtype": "bfloat16"}
    card = D.model_card(report, "")
    assert card.startswith("# Draft model for org/base\n")
    assert "A 1.5M-parameter causal LM (2 layers of 128), 10% of its target's parameters" in card
    assert 'beside `model = "org/base"`' in card
    assert "- Data: stdlib, /src (300 windows of 256 tokens)" in card
    assert "- Training: 600 steps, 81.5 s, final distillation loss 1.234." in card
    assert "- Held-out agreement with the target's greedy token: 0.61." in card
    assert "- Command: `memosight train draft`" in card  # no command given: the bare one
