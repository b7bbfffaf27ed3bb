"""The corpus builder: filtering, deduplication by content hash, a deterministic split by file."""

from __future__ import annotations

import platform

import pytest

from memosight.engine.protocol import EngineError
from memosight.engine.train.corpus import EXCLUDED_NAMES, build_corpus, read_folder, resolve_sources


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_duplicates_big_files_and_evaluation_packages_are_left_out(tmp_path):
    write(tmp_path, "a.py", "x = 1\n")
    write(tmp_path, "copy_of_a.py", "x = 1\n")
    write(tmp_path, "big.py", "y = 2\n" * 40_000)
    write(tmp_path, "requests/api.py", "def get(url): ...\n")
    write(tmp_path, "notes.txt", "not code\n")
    (tmp_path / "latin1.py").write_bytes(b"s = '\xe9'\n")

    corpus = build_corpus(resolve_sources([str(tmp_path)]), val_fraction=0.0)

    assert [f.path for f in corpus.train] == [f"{tmp_path.name}/a.py"]
    assert corpus.skipped == {"duplicate": 1, "too big": 1, "not UTF-8": 1}
    assert "requests" in EXCLUDED_NAMES


def test_split_is_by_content_hash_and_deterministic(tmp_path):
    for i in range(60):
        write(tmp_path, f"m{i}.py", f"value_{i} = {i}\n")
    first = build_corpus(resolve_sources([str(tmp_path)]), val_fraction=0.2)
    second = build_corpus(resolve_sources([str(tmp_path)]), val_fraction=0.2)

    assert [f.path for f in first.validation] == [f.path for f in second.validation]
    assert 3 <= len(first.validation) <= 25
    assert not {f.digest for f in first.train} & {f.digest for f in first.validation}


def test_stdlib_source_records_its_licence():
    (source,) = resolve_sources(["stdlib"])
    assert source.licence == "PSF-2.0" and (source.root / "textwrap.py").exists()
    assert source.origin == f"Python {platform.python_version()} standard library"


def test_sources_are_named_by_package_and_version():
    import pytest as installed

    by_name = {s.name: s for s in resolve_sources(["site"])}
    assert by_name["_pytest"].origin == f"_pytest from pytest {installed.__version__} (site-packages)"
    (folder,) = resolve_sources([str(by_name["_pytest"].root)])
    assert folder.origin == "_pytest (a folder given on the command line)"
    with pytest.raises(EngineError, match="corpus folder not found"):
        resolve_sources(["/no/such/folder"])


def test_read_folder_keeps_everything_for_evaluation(tmp_path):
    write(tmp_path, "requests/api.py", "def get(url): ...\n")
    write(tmp_path, "click/core.py", "class Command: ...\n")
    assert [f.path for f in read_folder(tmp_path, max_files=1)] == [f"{tmp_path.name}/click/core.py"]
