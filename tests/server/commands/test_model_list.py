"""`memosight model list` (model_list.py): one row per catalog model with its file's state in the
cache, its parameters and the memory its weights take, as JSON and as an aligned table."""

from __future__ import annotations

import argparse
import hashlib
import json

import pytest
from memosight.engine.loading import catalog
from memosight.engine.loading.catalog import CatalogModel
from memosight.server.commands import model_list

HEADERS = ["NAME", "FILE", "STATE", "PARAMS", "RAM (CPU, llama.cpp)", "RAM (CPU, torch float32)",
           "IN GPU MEMORY (bfloat16)"]


def entry(name: str, data: bytes, params: int) -> CatalogModel:
    return CatalogModel(name=name, repo=f"test/{name}", revision="b" * 40, file=f"{name}.gguf",
                        sha256=hashlib.sha256(data).hexdigest(), size=len(data), params=params, summary=f"{name} model")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def listed(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    model_list.add_arguments(parser)
    assert model_list.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_each_model_is_listed_with_the_state_of_its_file_and_the_memory_of_its_weights(cache, monkeypatch, capsys):
    data = bytes(range(256)) * 4
    models = {m.name: m for m in (entry("missing", data, 1_540_000_000), entry("partial", data, 630_167_424),
                                  entry("unchecked", data, 1000), entry("wrong", data, 1000),
                                  entry("verified", data, 1000))}
    monkeypatch.setattr(catalog, "CATALOG", models)  # the listing reads the catalog when it runs
    folder = cache / "models"
    folder.mkdir(parents=True)
    (folder / "partial.gguf.part").write_bytes(data[:len(data) // 3])  # an interrupted pull
    (folder / "unchecked.gguf").write_bytes(data)
    (folder / "wrong.gguf").write_bytes(data[:-1])
    (folder / "verified.gguf").write_bytes(data)
    assert catalog.check(models["verified"]) is None  # a pull's full check leaves its marker

    result = json.loads(listed(capsys, "--json"))
    assert result["folder"] == str(folder)
    assert [(m["name"], m["state"]) for m in result["models"]] == [
        ("missing", "missing"), ("partial", "partial (33%)"), ("unchecked", "unchecked"), ("wrong", "wrong size"),
        ("verified", "verified")]
    first = result["models"][0]
    assert first == {"name": "missing", "file_bytes": 1024, "state": "missing", "path": str(folder / "missing.gguf"),
                     "params": 1_540_000_000,
                     # llama.cpp: the file, its KV cache and buffers (0.14 GB for 0.63B parameters, scaled);
                     # torch: 4 bytes a parameter on a CPU (float32), 2 on a GPU (bfloat16); GB of 1e9 bytes
                     "cpu_llamacpp_gb": 0.3, "cpu_float32_gb": 6.2, "gpu_bfloat16_gb": 3.1,
                     "repo": "test/missing", "revision": "b" * 40, "summary": "missing model"}
    assert (result["models"][1]["cpu_float32_gb"], result["models"][1]["gpu_bfloat16_gb"]) == (2.5, 1.3)

    table = listed(capsys)  # without --json: the table, with the same states
    assert "partial (33%)" in table and f"files: {folder}" in table and "{" not in table


def test_the_table_is_aligned_under_its_headers_with_sizes_in_mb_and_params_in_billions():
    result = {"folder": "/cache/models", "models": [
        {"name": "qwen2.5-coder-0.5b", "file_bytes": 491_400_064, "state": "verified", "params": 630_167_424,
         "cpu_llamacpp_gb": 0.6, "cpu_float32_gb": 2.5, "gpu_bfloat16_gb": 1.3},
        {"name": "big", "file_bytes": 1_234_567_890, "state": "partial (33%)", "params": 12_000_000,
         "cpu_llamacpp_gb": 1.4, "cpu_float32_gb": 0.0, "gpu_bfloat16_gb": 0.0}]}
    lines = model_list._render(result).split("\n")
    header = lines[0]
    starts = [header.index(h) for h in HEADERS]
    assert starts == sorted(starts) and all(b - a >= len(h) + 2 for a, b, h in zip(starts, starts[1:], HEADERS))

    def cells(line: str) -> list[str]:  # each column read where its header stands
        return [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]

    assert cells(header) == HEADERS
    assert cells(lines[1]) == ["qwen2.5-coder-0.5b", "491 MB", "verified", "0.63B", "~0.6 GB", "~2.5 GB", "~1.3 GB"]
    assert cells(lines[2]) == ["big", "1,235 MB", "partial (33%)", "0.01B", "~1.4 GB", "~0.0 GB", "~0.0 GB"]
    assert all(line == line.rstrip() for line in lines)
    assert lines[3] == "" and lines[4] == "files: /cache/models"
    assert lines[-1] == 'get one: memosight model pull NAME; then model = "NAME" in .memosight.toml'
