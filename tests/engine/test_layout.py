"""The engine's rooms import each other without a cycle, counting every import: at the top, inside a
function and under TYPE_CHECKING (tests/import_graph.py)."""

from __future__ import annotations

from pathlib import Path

from ..import_graph import cycles, import_graph

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from . import a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n")
    assert cycles(import_graph(package, "pkg")) == [["pkg.a", "pkg.b"]]


def test_the_engine_has_no_import_cycle():
    assert cycles(import_graph(ENGINE, "memosight.engine")) == []
