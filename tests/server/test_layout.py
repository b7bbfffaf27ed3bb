"""The server's rooms import each other without a cycle, counting every import (tests/import_graph.py),
and outside the command-line tools reach the engine only through its door."""

from __future__ import annotations

import ast
from pathlib import Path

from ..import_graph import cycles, import_graph

SERVER = Path(__file__).resolve().parents[2] / "server"


def test_the_server_has_no_import_cycle():
    assert cycles(import_graph(SERVER, "memosight.server")) == []


# The server's rooms from the bottom up: a room imports only from its own and the rooms below it.
ROOMS = [
    {"rpc", "caching"},  # the wire (rpc/: framing, connection), and the bounded caches any room may use
    {"documents", "config", "languages"},  # the editor's texts and the user's settings
    {"context"},  # what a prompt is made of
    {"request"},  # the request: suggester, runs, work ahead, completion cache, engine holder, messages, timeline
    {"lsp", "status", "editor_log", "model_offer", "__main__", "with_faults"},  # the LSP handlers and the process
    {"commands", "bench", "cli"},  # the command-line tools and the benchmarks' harnesses
]


def room_of(module: str) -> int:
    top = module.removeprefix("memosight.server").lstrip(".").split(".")[0] or "__init__"
    found = [i for i, room in enumerate(ROOMS) if top in room]
    assert found or top == "__init__", f"{module} is in no room: add it to ROOMS"
    return found[0] if found else -1


def test_no_room_imports_from_a_room_above_it():
    graph = import_graph(SERVER, "memosight.server")
    upward = [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets)
              if room_of(b) > room_of(a) >= 0]
    assert upward == []


# The one door (DESIGN.md): outside the command-line tools, the server reaches the engine only through
# `memosight.engine` (load_engine, the catalog) and `memosight.engine.protocol`.
DOOR = {"memosight.engine", "memosight.engine.protocol"}


def engine_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found.update(n for n in names if n.split(".")[:2] == ["memosight", "engine"])
    return found


def test_outside_its_tools_the_server_reaches_the_engine_only_through_its_door():
    past = [f"{path.relative_to(SERVER)}: {name}" for path in sorted(SERVER.rglob("*.py"))
            if path.relative_to(SERVER).parts[0] not in ("commands", "cli.py")
            for name in sorted(engine_imports(path) - DOOR)]
    assert past == []
