"""Model runs done before a request asks for them, on the engine thread: the warm-up of a prompt
(after an edit, on entering a file) and the prefetch of the suggestion that follows taking the one
on screen. A request for other text stops them; a request for exactly their text waits for them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from memosight.engine.protocol import CompletionRequest, Engine, RequestOptions

from .completion_cache import CompletionCache, context_key
from .config import Settings
from .context.service import ContextService
from .documents import Document
from .engine_choice import EngineHolder
from .requests import Counters, Ticket

log = logging.getLogger(__name__)


class Ahead:
    """At most one warm-up and one prefetch per document (dropped when it closes)."""

    def __init__(self, engine: EngineHolder, context: ContextService, completions: Callable[[], CompletionCache],
                 counters: Counters, run_model: Callable, ensure_engine: Callable[[Settings], Future]):
        self._engine, self._context, self._completions = engine, context, completions
        self._counters, self._run_model, self._ensure_engine = counters, run_model, ensure_engine
        self._warm_ups: dict[str, threading.Event] = {}  # uri -> the cancel event of its pending warm-up
        self._prefetches: dict[str, tuple[tuple, threading.Event]] = {}  # uri -> (its context key, cancel)
        self.stopped = False

    # --- prefetch: the suggestion after the one on screen ---------------------------------------

    def prefetch(self, ticket: Ticket, shown: str, settings: Settings) -> None:
        """`shown` went on screen: compute, on the engine thread while the user reads it, the
        suggestion that follows taking it, so that after Tab the next one is ready (llama.vim does
        this). A request for any other text stops it."""
        engine = self._engine.ready()
        seen, cursor = ticket.seen, ticket.cursor
        # Not in a large document: the text with the suggestion taken would be a copy of all of it.
        if engine is None or not settings.prefetch or self.stopped or ticket.doc.closed or seen.large:
            return
        text, at = seen.text[:cursor] + shown + seen.text[cursor:], cursor + len(shown)
        if self._completions().has(seen.uri, text, at):
            return
        self.stop_prefetch(seen.uri)
        cancel = threading.Event()
        self._prefetches[seen.uri] = (context_key(seen.uri, text, at), cancel)
        doc = Document(seen.uri, text, seen.language, seen.version)
        self._engine.submit(self._prefetch, engine, doc, at, settings, cancel)

    def stop_prefetch(self, uri: str, unless_at: tuple | None = None) -> None:
        """Stop the prefetch of `uri`, unless it computes the suggestion at `unless_at` (a context
        key): then the request at that context waits for it on the engine thread and finds it."""
        running = self._prefetches.get(uri)
        if running is not None and running[0] != unless_at:
            running[1].set()
            del self._prefetches[uri]

    def _prefetch(self, engine: Engine, doc: Document, cursor: int, settings: Settings,
                  cancel: threading.Event) -> None:
        if cancel.is_set():
            return
        try:
            text, completion = self._run_model(engine, doc, cursor, settings, cancel)
            if completion.stop_reason != "cancelled":
                self._completions().put(doc.uri, doc.text, cursor, text, "prefetch")
                self._counters.prefetched += 1
        except Exception:  # noqa: BLE001 - a failed prefetch costs only the head start
            log.exception("prefetch after a suggestion failed")

    # --- warm-up: the prompt a request at the cursor would get ------------------------------------

    def warm(self, doc: Document, cursor: int, settings: Settings) -> None:
        """An edit landed at `cursor` (or the user entered the file there): prefill the prompt a
        request there would get, now, on the engine thread. Editors wait 75-350 ms before they ask;
        the request then finds its prompt (mostly) computed. A newer edit or the request itself
        stops it between chunks."""
        self.stop_warm_up(doc.uri)
        self.stop_prefetch(doc.uri, unless_at=context_key(doc.uri, doc.text, cursor))
        if not settings.prefill_on_edit or self.stopped:
            return
        cancel = self._warm_ups[doc.uri] = threading.Event()
        self._counters.warm_ups += 1
        # The engine thread runs in order: a warm-up sent while the engine loads runs right after it
        # (a file opened at start is then warm before the user's first key).
        self._engine.submit(self._warm_up, self._ensure_engine(settings), Ticket.of(doc, cursor), settings, cancel)

    def stop_warm_up(self, uri: str) -> None:
        cancel = self._warm_ups.pop(uri, None)
        if cancel is not None:
            cancel.set()

    def stop_warm_ups(self) -> None:
        for uri in list(self._warm_ups):
            self.stop_warm_up(uri)

    def _warm_up(self, loading: Future, ticket: Ticket, settings: Settings, cancel: threading.Event) -> None:
        if cancel.is_set() or ticket.stale() or not loading.done() or loading.exception() is not None:
            return
        engine = loading.result()
        try:
            doc = ticket.doc.frozen()
            if doc.text is not ticket.seen.text:
                return
            view, view_cursor = doc.around(ticket.cursor)
            context = self._context.build_for_warm_up(engine, view, view_cursor, settings)
            engine.prefill(CompletionRequest(context.prefix, context.suffix, doc.language, cancel=cancel,
                                             options=RequestOptions(heal=settings.token_healing)))
        except Exception:  # noqa: BLE001 - a failed warm-up costs only the head start
            log.exception("prefill after an edit failed")

    def forget(self, uri: str) -> None:
        self.stop_warm_up(uri)
        self.stop_prefetch(uri)

    def memory(self) -> dict:
        return {"warm_ups": len(self._warm_ups), "prefetches": len(self._prefetches)}

    def holds(self, uri: str) -> bool:
        """Whether a warm-up or a prefetch of `uri` is pending."""
        return uri in self._warm_ups or uri in self._prefetches
