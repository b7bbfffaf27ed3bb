"""memosight/status (status.py): the engine's figures, the settings in force, and what each bounded
structure holds beside the process's memory."""

from lsprotocol import types
from memosight.server.documents import text_digest

from .test_lsp import SOURCE, inline, open_doc


async def test_status_counts_requests_and_accepted_suggestions(tmp_path, lsp_session, lsp_status):
    async with lsp_session(tmp_path, init_options={"max_new_tokens": 4}) as client:
        uri = open_doc(client, tmp_path / "a.py")
        await inline(client, uri, 1, 4)
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="memosight.accepted", arguments=[4]))
        info = await lsp_status(client)
        assert info["state"] == "ready" and info["model"] == "scripted"
        assert info["requests"]["accepted"] == 1 and info["requests"]["completed"] == 1
        assert info["requests"]["accepted_chars"] == 4 and info["documents"] == 1
        memory = info["memory"]  # what each bounded structure holds, beside the process's memory
        assert memory["documents"]["open"] == 1 and memory["documents"]["open_chars"] == len(SOURCE)
        assert memory["completion_cache_entries"] == info["completion_cache"]["entries"] >= 1
        assert 0 < memory["rss_mb"] <= memory["peak_rss_mb"]


async def test_status_gives_each_open_documents_digest_when_asked(tmp_path, lsp_session, lsp_status):
    async with lsp_session(tmp_path) as client:
        open_doc(client, tmp_path / "a.py")
        assert "digests" not in await lsp_status(client)
        info = await lsp_status(client, {"digests": True})
        assert list(info["digests"].values()) == [text_digest(SOURCE)]  # (pygls renames keys that are URIs)
        assert info["settings"]["engine"]["model"] is None  # the settings in force, the engine's in its spec
