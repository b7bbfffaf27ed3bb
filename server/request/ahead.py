"""Model runs done before a request asks for them, on the engine thread: the warm-up of a prompt
(after an edit, on entering a file), the prefetch of the suggestion that follows taking the one on
screen, and, when the user pauses, the refresh that makes exact what keystrokes reused approximately
(the engine's moved cells). Warm-ups and prefetches run through runs.py; this module decides when. A
request for other text stops them; a request typed along a prefetch joins it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..config import Settings
from ..documents import Document
from .completion_cache import CompletionCache
from .engine_choice import EngineHolder
from .records import Counters, Ticket
from .pause import PauseWatcher
from .runs import Runs

log = logging.getLogger(__name__)

# No edit for this long is a pause: keys within a burst come 60-250 ms apart (the typists the
# benchmarks replay: server/bench/typist.py), so a refresh starts only between bursts; one that
# starts early costs little, as the next key stops it within a node of llama.cpp's graph.
REFRESH_AFTER_S = 0.3


class Ahead:
    """At most one warm-up and one prefetch per document (dropped when it closes)."""

    def __init__(self, engine: EngineHolder, runs: Runs, completions: CompletionCache, counters: Counters,
                 ensure_engine: Callable[[Settings], Future]):
        self._engine, self._runs, self._completions = engine, runs, completions
        self._counters, self._ensure_engine = counters, ensure_engine
        # uri -> its pending warm-up: (its cancel event, the text and cursor it warms)
        self._warm_ups: dict[str, tuple[threading.Event, str, int]] = {}
        self._refresh: threading.Event | None = None  # the pending refresh's cancel event
        self._refresh_lock = threading.Lock()
        self._pause = PauseWatcher(REFRESH_AFTER_S, self._paused)
        self.stopped = False

    # --- prefetch: the suggestion after the one on screen ---------------------------------------

    def prefetch(self, ticket: Ticket, shown: str, settings: Settings) -> None:
        """`shown` went on screen: compute, on the engine thread while the user reads it, the
        suggestion that follows taking it, so that after Tab the next one is ready (llama.vim does
        this). It is the document's run until a request for other text stops it."""
        engine = self._engine.ready()
        seen, cursor = ticket.seen, ticket.cursor
        # Not in a large document: the text with the suggestion taken would be a copy of all of it.
        if engine is None or not settings.prefetch or self.stopped or ticket.doc.closed or seen.large:
            return
        text, at = seen.text[:cursor] + shown + seen.text[cursor:], cursor + len(shown)
        if self._completions.has(seen.uri, text, at):
            return
        taken = Ticket.of(Document(seen.uri, text, seen.language, seen.version), at)
        self._runs.submit(self._runs.start(taken, settings, source="prefetch"), engine, taken)

    # --- warm-up: the prompt a request at the cursor would get ------------------------------------

    def warm(self, doc: Document, cursor: int, settings: Settings) -> None:
        """An edit landed at `cursor` (or the user entered the file there): prefill the prompt a
        request there would get, now, on the engine thread. Editors wait 75-350 ms before they ask;
        the request then finds its prompt (mostly) computed. A newer edit or the request itself
        stops it between chunks."""
        self.stop_warm_up(doc.uri)
        self.stop_refresh()
        self._runs.stop_prefetch_unless_at(doc.uri, doc.text, cursor)
        if self.stopped:
            return
        self._pause.edited()  # (with prefill_on_edit off too: a request's prefill moves cells as well)
        if not settings.prefill_on_edit:
            return
        cancel = threading.Event()
        self._warm_ups[doc.uri] = (cancel, doc.text, cursor)
        self._counters.warm_ups += 1
        # The engine thread runs in order: a warm-up sent while the engine loads runs right after it
        # (a file opened at start is then warm before the user's first key).
        self._engine.submit(self._runs.warm_up, self._ensure_engine(settings), Ticket.of(doc, cursor), settings, cancel)

    def stop_warm_up(self, uri: str) -> None:
        pending = self._warm_ups.pop(uri, None)
        if pending is not None:
            pending[0].set()

    def stop_warm_ups(self, keep: Ticket | None = None) -> None:
        """Every warm-up stops (a llama.cpp prefill at once, the rest between chunks), but the one of
        `keep`'s very text and cursor: it computes that request's prompt, which would start it again."""
        self.stop_refresh()
        for uri, (_, text, cursor) in list(self._warm_ups.items()):
            if keep is None or uri != keep.seen.uri or text is not keep.seen.text or cursor != keep.cursor:
                self.stop_warm_up(uri)

    # --- refresh: a pause makes exact what keystrokes reused approximately -----------------------

    def _paused(self) -> None:
        """No edit for REFRESH_AFTER_S: the engine, after what it is asked already, computes again
        the cells keystrokes moved into place (llama.cpp: runtime/llamacpp_prompt.py). The next
        edit or request stops it."""
        engine = self._engine.ready()
        if engine is None or self.stopped:
            return
        cancel = threading.Event()
        with self._refresh_lock:
            if self._refresh is not None:
                self._refresh.set()
            self._refresh = cancel
        self._counters.refreshes += 1
        self._engine.submit(_refresh, engine, cancel)

    def stop_refresh(self) -> None:
        with self._refresh_lock:
            if self._refresh is not None:
                self._refresh.set()
                self._refresh = None

    def close(self) -> None:
        self.stopped = True
        self.stop_refresh()
        self._pause.close()

    def forget(self, uri: str) -> None:
        self.stop_warm_up(uri)
        self._runs.stop(uri, source="prefetch")

    def memory(self) -> dict:
        return {"warm_ups": len(self._warm_ups)}

    def holds(self, uri: str) -> bool:
        """Whether a warm-up or a prefetch of `uri` is pending."""
        return uri in self._warm_ups or self._runs.running(uri, source="prefetch")


def _refresh(engine, cancel: threading.Event) -> None:
    if cancel.is_set():
        return
    try:
        engine.refresh(cancel)
    except Exception:  # noqa: BLE001 - a failed refresh leaves the cells as the keystrokes left them
        log.exception("making the moved cells exact failed")
