"""The editor's offer to download a catalog model. When the settings name one (`model =
"qwen2.5-coder-0.5b"`, see `memosight model list`) whose file is not on disk, the user is asked once a
session (window/showMessageRequest: "Download" / "Not now"); "Download" pulls it (catalog.py `pull`)
on a thread of its own, never the event loop nor the engine thread, under a progress bar, and then
the settings are applied again, which loads it. "Not now", or a client that cannot ask, is told the
command that downloads it.

Until the file is there the engine gets the embedded model in its place (`stand_in`): a missing file
is an offer rather than a failed load and its error, and the file's arrival (from here or from
`memosight model pull` in a terminal) changes the settings the engine gets, so the next request loads it.

Plain Python over the connection and the editor's log; lsp.py only calls it. huggingface_hub is
imported by the pull, on its thread, never at import.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from lsprotocol import types

# the catalog's names, sizes and paths: no torch, and huggingface_hub only inside its pull
from memosight.engine import catalog

from .config import DEFAULT_ENGINE, Settings
from .editor_log import EditorLog, ProgressReports
from .rpc.connection import Connection

log = logging.getLogger(__name__)

DOWNLOAD = "Download"
NOT_NOW = "Not now"


def missing(settings: Settings) -> catalog.CatalogModel | None:
    """The catalog model the settings run in process, when its file is not on disk (a stat)."""
    engine = settings.engine
    model = catalog.CATALOG.get(engine.model) if engine.model and not engine.backend.remote else None
    return model if model is not None and not model.path.is_file() else None


def stand_in(settings: Settings) -> Settings:
    """The settings the engine gets: while they name a catalog model that is not downloaded, the
    embedded model instead (with its own draft and runtime); else the settings as they are."""
    if missing(settings) is None:
        return settings
    engine = dataclasses.replace(settings.engine, model=DEFAULT_ENGINE.model, draft_model=DEFAULT_ENGINE.draft_model,
                                 runtime=DEFAULT_ENGINE.runtime)
    return dataclasses.replace(settings, engine=engine)


def can_ask(capabilities: types.ClientCapabilities) -> bool:
    """Whether the client says it takes window/showMessageRequest (LSP 3.16's window.showMessage)."""
    return bool(capabilities.window and capabilities.window.show_message is not None)


def pull_command(name: str) -> str:
    return f"`memosight model pull {name}`"


class ModelOffer:
    """Each missing catalog model offered once a session, and downloaded when the user says so."""

    def __init__(self, connection: Connection, editor_log: EditorLog,
                 report: Callable[[str, types.MessageType], None], downloaded: Callable[[], None]) -> None:
        self.connection = connection  # its send_request awaits the client's answer
        self.editor_log = editor_log
        self._report = report  # a pop-up and a log line (the server's report)
        self._downloaded = downloaded  # the file is in place: the settings are applied again
        self.offered: set[str] = set()  # model names, this session
        self._tasks: set[asyncio.Task] = set()  # offers and downloads running, held until done

    def consider(self, settings: Settings, capabilities: types.ClientCapabilities) -> None:
        """On the event loop, once the client is initialized: offer the catalog model `settings`
        name (the user's, not stand_in's) if its file is missing and it was not offered yet."""
        model = missing(settings)
        if model is None or model.name in self.offered:
            return
        self.offered.add(model.name)
        self._hold(self._offer(model, can_ask(capabilities)))

    def _hold(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("offering a model for download failed", exc_info=exc)

    async def _offer(self, model: catalog.CatalogModel, ask: bool) -> None:
        name, size = model.name, f"{model.size / 1e6:,.0f} MB"
        if catalog.hub_offline():
            self._report(f"MemoSight: {name} is not downloaded, and HF_HUB_OFFLINE is set: {catalog.by_hand(model)}. "
                         "Until then the embedded model runs.", types.MessageType.Warning)
            return
        later = (f"MemoSight: {name} is not downloaded ({size}); {pull_command(name)} in a terminal downloads it, "
                 "and the next completion loads it. Until then the embedded model runs.")
        if not ask:
            self._report(later, types.MessageType.Warning)
            return
        try:
            question = types.ShowMessageRequestParams(
                type=types.MessageType.Info, message=f"MemoSight: {name} is not downloaded ({size}). Download it now?",
                actions=[types.MessageActionItem(DOWNLOAD), types.MessageActionItem(NOT_NOW)])
            answer = await self.connection.send_request(types.WINDOW_SHOW_MESSAGE_REQUEST, question)
        except Exception as exc:  # noqa: BLE001 - a client that fails the request is told in its log instead
            log.info("window/showMessageRequest failed: %s", exc)
            answer = None
        if _title(answer) != DOWNLOAD:  # "Not now", or the message closed (null)
            log.info("%s: the user did not download it", name)
            self.editor_log.log(types.MessageType.Info, later)
            return
        await self.download(model)

    async def download(self, model: catalog.CatalogModel) -> None:
        """Pull `model` on a thread of its own under a progress bar; once it is in place and checked,
        the settings are applied again (the engine loads it)."""
        reports = ProgressReports(self.editor_log)

        def progress(done: int, total: int) -> None:  # on the download's thread
            reports.report(done * 100 / total if total else 0, f"{done / 1e6:,.0f} of {total / 1e6:,.0f} MB")

        work = _on_a_thread(lambda: catalog.pull(model.name, say=log.info, progress=progress))
        self._hold(self.editor_log.progress("MemoSight", f"downloading {model.name}", work, reports,
                                            done="downloaded"))
        try:
            pulled = await asyncio.wrap_future(work)
        except catalog.PullError as exc:  # it says what to do
            self._report(f"MemoSight: {exc}", types.MessageType.Error)
            return
        except Exception as exc:  # the server goes on with the embedded model
            log.error("downloading %s failed", model.name, exc_info=exc)
            self._report(f"MemoSight: downloading {model.name} failed ({exc}); {pull_command(model.name)} in a "
                         "terminal says more", types.MessageType.Error)
            return
        self.editor_log.log(types.MessageType.Info,
                            f"MemoSight: {model.name} is downloaded and verified: {pulled.path}")
        self._downloaded()


def _title(answer: Any) -> str | None:
    """The title of the action the user chose: a MessageActionItem, or its JSON where it was not typed."""
    if isinstance(answer, dict):
        return answer.get("title")
    return getattr(answer, "title", None)


def _on_a_thread(fn: Callable[[], Any]) -> Future:
    """`fn()` on a daemon thread of its own: a download holds neither the event loop nor the engine
    thread, nor the process open at exit."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(exc)

    threading.Thread(target=run, name="memosight-download", daemon=True).start()
    return future
