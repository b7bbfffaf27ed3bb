"""The editor's offer to download a catalog model the settings name but the disk lacks: the real
server driven by pytest-lsp's client (which answers window/showMessageRequest), in this process and
over stdio, downloading from a Hugging Face stand-in on 127.0.0.1 (HF_ENDPOINT) a small file that a
catalog entry pins. "Download": a progress bar that fills, the file in place and verified, then the
engine loads it; "Not now" and a client that cannot ask: the command that downloads it, and nothing
downloaded. The engine is the scripted test engine: what is tested is the offer, not a model."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types
from memosight.engine.loading import catalog
from memosight.engine.loading.catalog import CATALOG, CatalogModel
from pytest_lsp import ClientServerConfig
from pytest_lsp.client import make_test_lsp_client

from .commands.test_model_pull import REPO, REVISION, FakeHub
from .conftest import ScriptedEngine

NAME = "tiny-offer"
ASKS = types.ClientCapabilities(window=types.WindowClientCapabilities(
    work_done_progress=True, show_message=types.ShowMessageRequestClientCapabilities()))


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants

    data = bytes(range(256)) * 1200  # 300 KB: ten 32 KiB chunks below
    model = CatalogModel(name=NAME, repo=REPO, revision=REVISION, file="tiny-offer.gguf",
                         sha256=hashlib.sha256(data).hexdigest(), size=len(data), params=1000, summary="test")
    monkeypatch.setitem(CATALOG, NAME, model)
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    server = FakeHub(model.file, data)
    monkeypatch.setenv("HF_ENDPOINT", server.url)  # read by the pull when it runs
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # tests/conftest.py sets it for the rest
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    # huggingface_hub read HF_HUB_OFFLINE=1 at its import (tests/conftest.py): this test process only
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 32 * 1024)
    server.model = model
    yield server
    server.close()


def answering(title: str | None):
    """A test client that answers every window/showMessageRequest with the action `title`; `.asked`."""
    client = make_test_lsp_client()
    client.asked = []

    @client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)
    def show_message_request(params: types.ShowMessageRequestParams):
        client.asked.append(params)
        return None if title is None else types.MessageActionItem(title=title)

    return client


def loads(specs: list):
    engine = ScriptedEngine()
    return engine, lambda spec: specs.append(spec) or engine


async def test_download_shows_progress_lands_verified_and_the_engine_loads_it(lsp_session, hub, tmp_path):
    specs: list = []
    engine, load = loads(specs)
    (tmp_path / "ws").mkdir()
    async with lsp_session(tmp_path / "ws", engine, init_options={"model": NAME}, capabilities=ASKS,
                           load_engine=load, client=answering("Download")) as client:
        model = hub.model
        await until(lambda: any(spec.model == NAME for spec in specs))
        (asked,) = client.asked
        assert asked.message == f"MemoSight: {NAME} is not downloaded (0 MB). Download it now?"
        assert [action.title for action in asked.actions] == ["Download", "Not now"]
        assert specs[0].model is None  # the embedded model ran until the file was there

        assert model.path.read_bytes() == hub.data and catalog.state(model) == "verified"
        assert hub.gets() == [None]
        assert not [p for p in model.path.parent.iterdir() if p.name.startswith(".pull-")]

        def download_bar():
            return next((r for r in client.progress_reports.values() if r and isinstance(r[0], types.WorkDoneProgressBegin)
                         and r[0].message == f"downloading {NAME}"), None)

        await until(lambda: (bar := download_bar()) and isinstance(bar[-1], types.WorkDoneProgressEnd))
        begin, *reports, end = download_bar()
        assert begin.title == "MemoSight" and begin.percentage == 0
        assert reports and all(isinstance(r, types.WorkDoneProgressReport) for r in reports)
        percentages = [r.percentage for r in reports]
        assert percentages == sorted(percentages) and percentages[-1] == 100
        assert end.message == "downloaded"
        await until(lambda: any("downloaded and verified" in m.message for m in client.log_messages))
        assert not client.messages  # no pop-up: nothing failed


async def test_not_now_names_the_command_and_the_offer_is_not_repeated(lsp_session, hub, tmp_path, lsp_status):
    specs: list = []
    engine, load = loads(specs)
    (tmp_path / "ws").mkdir()
    async with lsp_session(tmp_path / "ws", engine, init_options={"model": NAME}, capabilities=ASKS,
                           load_engine=load, client=answering("Not now")) as client:
        await until(lambda: any(f"`memosight model pull {NAME}`" in m.message for m in client.log_messages))
        assert len(client.asked) == 1 and not client.messages  # a log line, not a pop-up
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"memosight": {"model": NAME, "max_new_tokens": 9}}))
        await lsp_status(client)  # answered after the change was applied (and any offer sent)
        assert len(client.asked) == 1  # once a session
        assert hub.requests == [] and not hub.model.path.exists()
        assert specs and all(spec.model is None for spec in specs)


async def test_a_corrupt_download_is_reported_and_the_embedded_model_stays(lsp_session, hub, tmp_path):
    body = bytearray(hub.data)
    body[len(body) // 2] ^= 0xFF
    hub.body = bytes(body)
    specs: list = []
    engine, load = loads(specs)
    (tmp_path / "ws").mkdir()
    async with lsp_session(tmp_path / "ws", engine, init_options={"model": NAME}, capabilities=ASKS,
                           load_engine=load, client=answering("Download")) as client:
        await until(lambda: client.messages)
        (popup,) = client.messages
        assert popup.type == types.MessageType.Error and "sha256" in popup.message
        assert f"memosight model pull {NAME}" in popup.message
        await until(lambda: any(isinstance(r[-1], types.WorkDoneProgressEnd) for r in client.progress_reports.values()
                                if r and r[0].message == f"downloading {NAME}"))
        (bar,) = [r for r in client.progress_reports.values() if r and r[0].message == f"downloading {NAME}"]
        assert bar[-1].message.startswith("failed: ")
        assert not hub.model.path.exists() and all(spec.model is None for spec in specs)


async def test_a_client_that_cannot_ask_is_told_the_command(lsp_session, hub, tmp_path):
    (tmp_path / "ws").mkdir()
    async with lsp_session(tmp_path / "ws", init_options={"model": NAME}, client=answering("Download")) as client:
        await until(lambda: any(f"`memosight model pull {NAME}`" in m.message for m in client.log_messages))
        assert client.asked == [] and hub.requests == []


# The server over stdio with the catalog entry added and the scripted engine (its conftest) behind it.
STDIO_SERVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from memosight.engine.loading.catalog import CATALOG, CatalogModel
entry = CatalogModel(**json.loads(sys.argv[2]))
CATALOG[entry.name] = entry
from conftest import ScriptedEngine
from memosight.server.__main__ import main
engine = ScriptedEngine()
sys.exit(main(["--stdio"], load_engine=lambda spec: engine))
"""


async def test_over_stdio_the_download_lands_and_the_settings_name_the_model_again(hub, tmp_path, lsp_status):
    model = hub.model
    entry = {key: getattr(model, key) for key in ("name", "repo", "revision", "file", "sha256", "size", "params",
                                                  "summary")}
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    command = [sys.executable, "-c", STDIO_SERVER, str(Path(__file__).parent), json.dumps(entry)]
    client = await ClientServerConfig(command, client_factory=lambda: answering("Download"), server_env=env).start()
    (tmp_path / "ws").mkdir()
    await client.initialize_session(types.InitializeParams(
        capabilities=ASKS, root_uri=(tmp_path / "ws").as_uri(), initialization_options={"model": NAME}))
    try:
        # a bar's token is created before its first report: an empty list for a moment
        await until(lambda: any(r and isinstance(r[-1], types.WorkDoneProgressEnd) and r[0].message == f"downloading {NAME}"
                                for r in client.progress_reports.values()))
        (asked,) = client.asked
        assert asked.message.startswith(f"MemoSight: {NAME} is not downloaded")
        (bar,) = [r for r in client.progress_reports.values() if r and r[0].message == f"downloading {NAME}"]
        assert [type(r) for r in bar[:2]] == [types.WorkDoneProgressBegin, types.WorkDoneProgressReport]
        assert bar[-2].percentage == 100 and bar[-1].message == "downloaded"
        assert model.path.read_bytes() == hub.data and catalog.state(model) == "verified"
        await until(lambda: any("downloaded and verified" in m.message for m in client.log_messages))
        assert (await lsp_status(client))["settings"]["engine"]["model"] == NAME
    finally:
        await client.shutdown_session()


def test_the_server_imports_neither_torch_nor_huggingface_hub():
    code = ("import sys, memosight.server.lsp, memosight.server.model_offer, memosight.server.__main__\n"
            "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
