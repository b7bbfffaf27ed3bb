import threading

import pytest
import torch

from memosight.engine import CompletionRequest, StopRule, load_engine
from memosight.engine.loading import ModelLoadError


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_generate_equals_transformers_greedy(tiny_models, arch):
    engine = load_engine(str(tiny_models[arch]), device="cpu")
    prompts = ["def add(a, b):\n    return", "class Item:\n    name", "import os\n", "x = [1, 2, 3]\nprint(x"]
    for prompt in prompts:
        ids = engine.encode(prompt)
        expected = engine.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        for speculative in (True, False):
            assert engine.generate(ids, 24, speculative=speculative) == expected.tolist()


def test_generate_reuses_the_cached_prefix_and_stays_exact(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    base = engine.encode("def total_value(self) -> float:\n    return sum(")
    first = engine.generate(base, 8)
    longer = base + engine.encode("item")
    second = engine.generate(longer, 8)
    fresh = load_engine(str(tiny_model_dir), device="cpu").generate(longer, 8)
    assert second == fresh
    assert engine.prompt_cache.reused_tokens >= len(base) - 1
    assert first  # something came out


def test_fim_template_detected_and_rendered(tiny_models):
    engine = load_engine(str(tiny_models["llama"]), device="cpu")
    assert engine.fim.name == "starcoder"
    ids = engine.prompt_ids("a = 1\n", "\nb = 2")
    assert ids[0] == engine.vocab["<fim_prefix>"] and ids[-1] == engine.vocab["<fim_middle>"]
    assert engine.vocab["<fim_suffix>"] in ids
    plain = load_engine(str(tiny_models["gpt2"]), device="cpu")
    assert plain.fim.name == "plain"
    assert plain.prompt_ids("a = 1\n", "b") == plain.encode("a = 1\n")


def test_special_token_text_in_a_file_stays_text(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    ids = engine.prompt_ids("s = '<fim_middle>'", "")
    assert ids.count(engine.vocab["<fim_middle>"]) == 1


def test_stream_pieces_join_to_the_completion(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    request = CompletionRequest("def add(a, b):\n    return ", "", "python", 20, StopRule())
    result: dict = {}
    pieces = list(engine.stream(request, result))
    assert "".join(pieces) == result["completion"].text
    assert result["completion"].tokens <= 20


def test_cancel_stops_between_steps(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    cancel = threading.Event()
    request = CompletionRequest("x = ", "", "python", 200, StopRule(), cancel)
    result: dict = {}
    for _ in engine.stream(request, result):
        cancel.set()
    assert result["completion"].stop_reason == "cancelled"
    assert result["completion"].tokens < 200


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


def test_spm_order_from_the_model_folder_puts_the_prefix_last(tiny_model_dir, tmp_path):
    import shutil

    folder = tmp_path / "spm"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "memosight.json").write_text('{"fim_order": "spm"}')
    engine = load_engine(str(folder), device="cpu")
    ids = engine.prompt_ids("a = 1\n", "\nb = 2")
    v = engine.vocab
    assert ids[:2] == [v["<fim_prefix>"], v["<fim_suffix>"]]
    assert ids[-len(engine.encode("a = 1\n")):] == engine.encode("a = 1\n")
    # typing extends the prompt at its end only
    longer = engine.prompt_ids("a = 1\nc", "\nb = 2")
    assert longer[: len(ids) - 1] == ids[:-1]


def test_continuation_loss_is_low_for_what_the_model_would_write(repeater_model_dir):
    engine = load_engine(str(repeater_model_dir), device="cpu")
    likely, n_likely = engine.continuation_loss("a = 1\n", "", "xxxx")
    unlikely, n_unlikely = engine.continuation_loss("a = 1\n", "", "b = 2")
    assert n_likely == len(engine.encode("xxxx")) and n_unlikely == len(engine.encode("b = 2"))
    assert 0.0 <= likely / n_likely < unlikely / n_unlikely
    assert engine.continuation_loss("a = 1\n", "", "") == (0.0, 0)
