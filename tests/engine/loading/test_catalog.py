"""The model catalog: well-formed pinned entries, a file checked in full once and then by its size
and marker, loads by name that say how to get a missing file, and no torch for the server."""

import hashlib
import os
import re
import subprocess
import sys

import pytest
from memosight.engine import ModelLoadError
from memosight.engine.loading import catalog, gguf
from memosight.engine.loading.catalog import CATALOG, CatalogModel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def entry(monkeypatch):
    data = b"GGUF" + bytes(range(256)) * 40
    model = CatalogModel(name="tiny-bytes", repo="test/tiny", revision="a" * 40, file="tiny-bytes.gguf",
                         sha256=hashlib.sha256(data).hexdigest(), size=len(data), params=1000, summary="test")
    monkeypatch.setitem(CATALOG, model.name, model)
    return model, data


def test_the_entries_are_pinned_to_a_commit_a_size_and_a_sha256():
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(CATALOG)
    for name, model in CATALOG.items():
        assert model.name == name and model.file.endswith(".gguf") and "/" in model.repo
        assert re.fullmatch("[0-9a-f]{40}", model.revision) and re.fullmatch("[0-9a-f]{64}", model.sha256)
        assert model.size > 100_000_000 and model.params > model.size  # 4-bit: fewer bytes than parameters
    small = CATALOG["qwen2.5-coder-0.5b"]
    assert (small.size, small.sha256[:12]) == (491400064, "1d9614638d18")
    # the name the project's shared script writes the file under
    assert small.file == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_files_live_in_the_cache_and_urls_follow_hf_endpoint_at_call_time(cache, monkeypatch):
    model = CATALOG["qwen2.5-coder-0.5b"]
    assert model.path == cache / "models" / model.file
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert model.url() == f"https://huggingface.co/{model.repo}/resolve/{model.revision}/{model.file}"
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example/")
    assert model.url().startswith("http://mirror.example/Qwen/")


def test_a_missing_file_says_pull_and_where_to_put_it(cache, entry):
    model, _ = entry
    with pytest.raises(ModelLoadError) as error:
        gguf.gguf_file(model.name)
    message = str(error.value)
    assert f"memosight model pull {model.name}" in message and str(model.path) in message
    assert model.url() in message and "\n" not in message


def test_a_file_is_hashed_once_then_known_by_its_size_and_mtime(cache, entry, monkeypatch):
    model, data = entry
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(data)
    hashed = []
    sha256_of = catalog.sha256_of
    monkeypatch.setattr(catalog, "sha256_of", lambda path: hashed.append(path) or sha256_of(path))
    assert catalog.state(model) == "unchecked"
    assert gguf.gguf_file(model.name) == model.path  # a file put there by hand is found
    assert catalog.state(model) == "verified" and len(hashed) == 1
    assert gguf.gguf_file(model.name) == model.path
    assert len(hashed) == 1  # the marker remembers it

    # the same size, other bytes, a new mtime: hashed again, and refused
    corrupt = bytearray(data)
    corrupt[100] ^= 0xFF
    model.path.write_bytes(bytes(corrupt))
    stat = model.path.stat()
    os.utime(model.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(ModelLoadError, match="sha256") as error:
        gguf.gguf_file(model.name)
    assert len(hashed) == 2 and f"memosight model pull {model.name}" in str(error.value)

    model.path.write_bytes(data[:-10])  # truncated: the size says so without hashing
    assert catalog.state(model) == "wrong size"
    with pytest.raises(ModelLoadError, match="bytes"):
        gguf.gguf_file(model.name)


def test_a_partial_download_is_listed_as_such(cache, entry):
    model, data = entry
    model.path.parent.mkdir(parents=True)
    model.path.with_name(model.file + catalog.PART_SUFFIX).write_bytes(data[: len(data) // 2])
    assert catalog.state(model) == f"partial ({(len(data) // 2) * 100 // len(data)}%)"
    assert catalog.state(CATALOG["qwen2.5-coder-1.5b"]) == "missing"


def test_an_unknown_name_is_not_a_catalog_name(cache):
    assert gguf.gguf_file("qwen2.5-coder-99b") is None  # a Hugging Face id or a folder, as before
    with pytest.raises(ModelLoadError, match="model list"):
        catalog.lookup("qwen2.5-coder-99b")


def test_the_server_side_reads_the_catalog_without_torch_or_huggingface_hub():
    code = ("import sys, memosight.engine.loading.catalog, memosight.server.config\n"
            "import memosight.server.commands.model_pull, memosight.server.commands.model_list\n"
            "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
