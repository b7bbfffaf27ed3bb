"""What the server may touch (README "Security"): it runs nothing from the workspace, writes nothing
into it, reads the workspace's own files (never through a link that leads out), and loads weights
only from safetensors; a project's config file names no file outside the workspace."""

from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types

from .conftest import ScriptedEngine, in_process_session
from .test_lsp import eventually, inline, open_doc

PACKAGE = Path(__file__).parents[2]
# The code a running server executes: the server and the engine, less the command-line tools and
# the trainers, which a user starts by hand on files they chose.
RUNTIME = [p for folder in ("server", "engine") for p in (PACKAGE / folder).rglob("*.py")
           if "commands" not in p.parts and "train" not in p.parts and "bench" not in p.parts]


def test_the_running_code_never_unpickles_runs_or_trusts_remote_code():
    assert len(RUNTIME) > 20
    forbidden = re.compile(r"trust_remote_code\s*=\s*True|weights_only\s*=\s*False|torch\.load\(|pickle\.loads?\("
                           r"|allow_pickle\s*=\s*True|\bsubprocess\b|os\.system\(|(?<![.\w])eval\(|(?<![.\w])exec\(")
    found = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}" for p in RUNTIME
             for n, line in enumerate(p.read_text().splitlines(), 1) if forbidden.search(line)]
    assert found == []


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_symlink(), p.read_bytes() if p.is_file() else None,
                                       p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


async def test_a_session_writes_nothing_into_the_workspace_and_reads_nothing_outside_it(tmp_path):
    root, outside = tmp_path / "project", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.py").write_text("def make_secret():\n    return 'hunter2-outside'\n")
    (root / "pkg" / "shapes.py").write_text("def area(w, h):\n    return w * h\n")
    (root / "pkg" / "secret.py").symlink_to(outside / "secret.py")
    # keys a hostile project might try: unknown ones are refused, and none of them names a file to read
    (root / ".memosight.toml").write_text(
        f'include = ["{outside}/secret.py"]\nlog_file = "{root}/log.txt"\ncontext_files = ["{outside}"]\n')
    before = tree(root)
    engine = ScriptedEngine("x")
    async with in_process_session(root, engine) as client:
        await eventually(lambda: client.server.workspace_index is not None and client.server.workspace_index.ready.is_set())
        uri = open_doc(client, root / "main.py", "from pkg.secret import make_secret\n\n\nvalue = area(2, 3) + make_secret(\n")
        await inline(client, uri, 3, 36)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(2, uri),
            [types.TextDocumentContentChangePartial(types.Range(types.Position(3, 36), types.Position(3, 36)), ")")]))
        client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri)))
        await inline(client, uri, 3, 37)
        messages = " | ".join(m.message for m in client.messages)
    prompts = [r.prefix + r.suffix for r in engine.requests]
    assert prompts and any("def area" in p for p in prompts)  # the workspace's own files are read
    assert not any("hunter2-outside" in p for p in prompts)  # a link out of the workspace is not
    assert "unknown key" in messages and "`include`" in messages
    assert tree(root) == before  # nothing written, nothing touched
