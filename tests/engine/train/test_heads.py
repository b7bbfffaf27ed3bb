"""Training draft heads: the base model's features computed once and resumed, a reduced vocabulary,
and a loop that resumes exactly."""

import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.train import heads as H
from memosight.engine.train.heads_base import torch_outputs


@pytest.fixture
def engine_and_windows(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
    windows = H.windows_from_texts(engine.tokenizer, [f"def f{i}(x):\n    return x * {i}\n" * 4 for i in range(8)],
                                   16, min(engine.eos_ids))
    return engine, windows


def test_features_are_the_base_models_outputs_and_are_computed_once(tmp_path, engine_and_windows):
    engine, windows = engine_and_windows
    features = H.compute_features(torch_outputs(engine.model), windows, tmp_path / "f")
    hidden, greedy = torch_outputs(engine.model)(windows)
    assert torch.allclose(features.hidden.float(), hidden, atol=1e-2)
    assert torch.equal(features.greedy.long(), greedy)
    again = H.compute_features(lambda *a: pytest.fail("the stored shards are read, not recomputed"), windows,
                               tmp_path / "f")
    assert torch.equal(again.hidden, features.hidden)


def test_features_of_other_windows_are_not_reused(tmp_path, engine_and_windows):
    engine, windows = engine_and_windows
    H.compute_features(torch_outputs(engine.model), windows, tmp_path / "f")
    other = H.compute_features(torch_outputs(engine.model), windows.flip(0), tmp_path / "f")
    assert torch.equal(other.greedy.long(), torch_outputs(engine.model)(windows.flip(0))[1])


def test_the_frequent_vocabulary_and_its_coverage():
    greedy = torch.tensor([[5, 5, 5, 5, 2, 2, 9, 1]])
    ids, coverage = H.frequent_tokens(greedy, 2, model_vocab=2048)
    assert ids.tolist() == [2, 5]
    assert coverage["1024"] == 1.0 and coverage["2048"] == 1.0
    labels = H.LabelMap(ids, 2048)
    assert labels(torch.tensor([5, 2, 9])).tolist() == [1, 0, -100]  # outside the vocabulary: not scored


def test_a_run_killed_after_its_checkpoint_resumes_where_an_uninterrupted_one_ends(tmp_path, engine_and_windows):
    engine, windows = engine_and_windows
    features = H.compute_features(torch_outputs(engine.model), windows, tmp_path / "f")
    cfg = H.HeadsTrainConfig(num_heads=2, seq_len=16, batch=8, steps=4, warmup=1, checkpoint_every=2, vocab_size=16)
    vocab_ids, _ = H.frequent_tokens(features.greedy, 16, len(engine.tokenizer))
    labels = H.LabelMap(vocab_ids, len(engine.tokenizer))
    embed = engine.model.get_input_embeddings()

    def fresh():
        heads = H.new_heads(engine.model.config.hidden_size, lambda ids: engine.model.get_output_embeddings().weight[ids], cfg, vocab_ids)
        return heads, H.make_optimizer(heads, cfg)

    def train(heads, optimizer, state, save):
        H.train_heads(heads, None, embed, features, labels, cfg, state, optimizer, save=save)

    whole, whole_opt = fresh()
    train(whole, whole_opt, H.HeadsState(), lambda state: None)

    def killed_after_checkpoint(state):
        H.save_checkpoint(tmp_path, part, part_opt, state)
        raise KeyboardInterrupt

    part, part_opt = fresh()
    with pytest.raises(KeyboardInterrupt):
        train(part, part_opt, H.HeadsState(), killed_after_checkpoint)
    again, again_opt = fresh()
    state = H.load_checkpoint(tmp_path, again, again_opt)
    assert state.step == 2
    train(again, again_opt, state, lambda state: None)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), again.parameters()))


def test_the_output_layer_starts_as_the_models_own_rows(engine_and_windows):
    engine, _ = engine_and_windows
    ids = torch.tensor([3, 7, 11])
    heads = H.new_heads(engine.model.config.hidden_size, lambda ids: engine.model.get_output_embeddings().weight[ids],
                        H.HeadsTrainConfig(vocab_size=3), ids)
    assert torch.equal(heads.out.weight, engine.model.get_output_embeddings().weight[ids])


def test_training_lowers_the_loss_on_a_learnable_pattern(engine_and_windows, tmp_path):
    engine, windows = engine_and_windows
    features = H.compute_features(torch_outputs(engine.model), windows, tmp_path / "f")
    cfg = H.HeadsTrainConfig(num_heads=2, seq_len=16, batch=64, steps=60, warmup=5, lr=3e-3, bf16=False)
    labels = H.LabelMap(None, len(engine.tokenizer))
    heads = H.new_heads(engine.model.config.hidden_size, None, cfg)
    state = H.HeadsState()
    H.train_heads(heads, engine.model.get_output_embeddings(), engine.model.get_input_embeddings(), features, labels,
                  cfg, state, H.make_optimizer(heads, cfg), save=lambda s: None)
    assert sum(state.losses[-10:]) / 10 < 0.9 * sum(state.losses[:5]) / 5
