"""The server's rooms import each other without a cycle, counting every import (tests/import_graph.py)."""

from __future__ import annotations

from pathlib import Path

from ..import_graph import cycles, import_graph

SERVER = Path(__file__).resolve().parents[2] / "server"


def test_the_server_has_no_import_cycle():
    assert cycles(import_graph(SERVER, "memosight.server")) == []
