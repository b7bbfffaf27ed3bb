"""Model runs on the engine thread, each from a cursor's context to the suggestion.

The request (suggest.py) and the work done ahead of it (ahead.py: a prompt's warm-up, the prefetch
of the suggestion that follows a Tab) run the model through here and nowhere else. One run per
document at a time: a request typed along the running one (a request's or a prefetch's) joins it
rather than starting its own, and every finished completion lands in the completion cache.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future

from memosight.engine.protocol import (
    CompletionRequest,
    Engine,
    EngineSettings,
    RequestOptions,
)

from ..config import Settings
from ..context.service import ContextService
from .completion_cache import CompletionCache
from .engine_choice import EngineHolder
from .mode import completion_ending
from .prompt_moves import PromptMoves
from .records import Counters, Generation, Suggestion, Ticket, rest_after, typed_into
from .timeline import Timeline

log = logging.getLogger(__name__)


class Runs:
    def __init__(self, engine: EngineHolder, context: ContextService, completions: CompletionCache,
                 counters: Counters, notice: Callable[[str], None]):
        self._engine, self._context, self._completions = engine, context, completions
        self._counters, self._notice = counters, notice
        self._latest: dict[str, Generation] = {}  # uri -> its latest run, until it is done
        self._lock = threading.Lock()  # the engine thread drops finished runs, the event loop adds
        self.moves = PromptMoves()  # where each prompt's prefill comes from (the engine thread's)

    # --- which run a request gets ---------------------------------------------------------------

    def joinable(self, uri: str, text: str, cursor: int, settings: Settings) -> Generation | None:
        """The document's run still going, under the same settings, that the text at `cursor`
        types along (the typed characters agree with what it wrote so far). A prefetch only at its
        very text: typed past it, its guess of what follows is stale (measured: joining it there
        left 12 of 238 bench replay requests without a suggestion)."""
        gen = self._latest.get(uri)
        if gen is None or gen.future is None or gen.future.done() or gen.cancel.is_set() or gen.settings != settings:
            return None
        typed = typed_into(gen.text, gen.cursor, text, cursor)
        if typed is None or (gen.source == "prefetch" and typed):
            return None
        return gen if rest_after(gen.partial, typed, running=True) is not None else None

    def start(self, ticket: Ticket, settings: Settings, source: str = "request") -> Generation:
        """A new run at the ticket's cursor, now the document's latest: the one before it stops.
        `submit` gives it to the engine thread (a request first waits for the engine to load)."""
        self.stop(ticket.seen.uri)
        gen = Generation(ticket.seen.text, ticket.cursor, settings=settings, source=source)
        with self._lock:
            self._latest[ticket.seen.uri] = gen
        return gen

    def submit(self, gen: Generation, engine: Engine, ticket: Ticket, *, cold: bool = False,
               timeline: Timeline | None = None, on_piece: Callable[[str], None] | None = None) -> Future:
        gen.future = self._engine.submit(self._complete, engine, ticket, gen, cold, timeline or Timeline(), on_piece)
        # The callback holds the run weakly: a future keeps its callbacks once done, and a run that
        # held its future's callback would be a cycle, freed only by the cyclic collector with its
        # document's text (measured: 100 MB more at bench fuzz's peak, heavy documents).
        uri, run = ticket.seen.uri, weakref.ref(gen)
        gen.future.add_done_callback(lambda _: self._drop(uri, run()))
        return gen.future

    def stop(self, uri: str, source: str | None = None) -> None:
        """Tell the document's run to stop (only if it is of `source`, when given)."""
        gen = self._latest.get(uri)
        if gen is not None and (source is None or gen.source == source):
            gen.cancel.set()
            self._drop(uri, gen)

    def drop_unstarted(self, uri: str, gen: Generation) -> None:
        """A run its request never gave to the engine thread (cancelled or overtaken while the
        engine loaded): nothing will run it, nor join it."""
        if gen.future is None:
            gen.cancel.set()
            self._drop(uri, gen)

    def stop_all(self) -> None:
        for uri in list(self._latest):
            self.stop(uri)

    def stop_prefetch_unless_at(self, uri: str, text: str, cursor: int) -> None:
        """An edit: the document's prefetch stops unless the edit made its very text (the Tab that
        takes the suggestion it follows)."""
        gen = self._latest.get(uri)
        if gen is not None and gen.source == "prefetch" and self.joinable(uri, text, cursor, gen.settings) is None:
            self.stop(uri)

    def running(self, uri: str, source: str | None = None) -> bool:
        gen = self._latest.get(uri)
        return gen is not None and (source is None or gen.source == source)

    def _drop(self, uri: str, gen: Generation | None) -> None:
        with self._lock:
            if gen is not None and self._latest.get(uri) is gen:
                del self._latest[uri]

    def __len__(self) -> int:
        return len(self._latest)

    # --- on the engine thread -------------------------------------------------------------------

    def _complete(self, engine: Engine, ticket: Ticket, gen: Generation, cold: bool, timeline: Timeline,
                  on_piece: Callable[[str], None] | None) -> Suggestion | None:
        """The context at the ticket's cursor, the engine's stream, the suggestion; None when the
        run was stopped or its document changed before the model got to it."""
        timeline.mark("engine_wait")
        try:
            return self._model_run(engine, ticket, gen, cold, timeline, on_piece)
        except Exception:
            if gen.source == "request":
                raise  # the request reports it to the user
            log.exception("a prefetch failed")  # costs only the head start
            return None
        finally:
            gen.first_lines.cancel()  # never set (one line, or none): the requests take the whole run

    def _model_run(self, engine: Engine, ticket: Ticket, gen: Generation, cold: bool, timeline: Timeline,
                   on_piece: Callable[[str], None] | None) -> Suggestion | None:
        if gen.cancel.is_set() or ticket.stale():
            return None
        started = time.perf_counter()
        # the document as it is now, and stays: the event loop goes on applying edits to the live one
        doc, cursor, settings = ticket.doc.frozen(), ticket.cursor, gen.settings
        if doc.text is not ticket.seen.text:
            return None
        # Settings that change without reloading the model; an engine makes repeating them cheap.
        engine.configure(EngineSettings(speculative=settings.speculative, kv_cache_bytes=settings.kv_cache_mb * 2**20,
                                        exact_prompt=settings.exact_prompt))
        view, view_cursor = doc.around(cursor)  # a large file: a window of it
        ending = completion_ending(view, view_cursor, settings)
        context = self._context.for_request(engine, view, view_cursor, settings, timeline.mark)
        timeline.mark("context")
        if ticket.stale():  # an edit arrived while the context was built: a newer request comes
            return None
        ahead = 0
        if gen.source == "request":  # a prefetch's prompt (the suggestion taken) is no keystroke's
            ahead, timeline.prefill_cause = self.moves.for_request(doc.uri, self.moves.move(doc.uri, context.prefix))
        request = CompletionRequest(context.prefix, context.suffix, doc.language, ending.max_new_tokens, ending.stop,
                                    gen.cancel, RequestOptions(cold=cold, heal=settings.token_healing),
                                    on_notice=self._notice)
        stream = engine.stream(request)
        try:
            for piece in stream:
                gen.partial += piece
                # A multi-line run's finished lines change only when a piece brings a newline.
                if ending.multiline and "\n" in piece and not gen.first_lines.done() \
                        and (lines := finished_lines(gen.partial)).strip():
                    gen.first_lines.set_result(Suggestion(
                        lines, cursor, (time.perf_counter() - started) * 1000, 0, "first_line"))
                if on_piece is not None and not gen.cancel.is_set():
                    on_piece(gen.partial)
        finally:
            stream.close()  # whatever happened here, the engine is free for the next run
        completion = stream.result()
        timeline.split(completion.stages_ms, "engine")
        timeline.steps = completion.steps
        timeline.tokens, timeline.prompt_tokens = completion.tokens, completion.prompt_tokens
        timeline.prefilled_tokens = completion.prompt_tokens - completion.reused_tokens
        timeline.prefilled_ahead = ahead
        timeline.stop_reason = completion.stop_reason
        if completion.stop_reason != "cancelled":
            self._completions.put(doc.uri, doc.text, cursor, completion.text, gen.source)
            self._counters.prefetched += gen.source == "prefetch"
        latency = (time.perf_counter() - started) * 1000
        log.debug("completion %s:%d %.1f ms (first piece %.1f ms) prompt %d tokens (%d cached), %d new, stop %s",
                  doc.uri.rsplit("/", 1)[-1], cursor, latency, completion.first_token_ms, completion.prompt_tokens,
                  completion.reused_tokens, completion.tokens, completion.stop_reason)
        timeline.mark("post")
        return Suggestion(completion.text, cursor, latency, completion.prompt_tokens, completion.stop_reason)

    def warm_up(self, loading: Future, ticket: Ticket, settings: Settings, cancel: threading.Event) -> None:
        """The prompt a request at the ticket's cursor would get, prefilled (ahead.py's warm-up)."""
        if cancel.is_set() or ticket.stale() or not loading.done() or loading.exception() is not None:
            return
        engine = loading.result()
        try:
            doc = ticket.doc.frozen()
            if doc.text is not ticket.seen.text:
                return
            started = time.perf_counter()
            view, view_cursor = doc.around(ticket.cursor)
            context = self._context.build_for_warm_up(engine, view, view_cursor, settings)
            cause = self.moves.move(doc.uri, context.prefix)
            built = time.perf_counter()
            tokens = engine.prefill(CompletionRequest(context.prefix, context.suffix, doc.language, cancel=cancel,
                                                      options=RequestOptions(heal=settings.token_healing)))
            self.moves.warmed(doc.uri, cause, tokens or 0)
            log.debug("warm-up %s:%d context %.1f ms, prefill %s tokens %.1f ms%s", doc.uri.rsplit("/", 1)[-1],
                      ticket.cursor, (built - started) * 1000, tokens, (time.perf_counter() - built) * 1000,
                      " (stopped)" if cancel.is_set() else "")
        except Exception:  # noqa: BLE001 - a failed warm-up costs only the head start
            log.exception("prefill after an edit failed")


def finished_lines(text: str) -> str:
    """The lines of `text` the model has finished writing (up to its last newline), without
    trailing blanks: a multi-line run's first answer."""
    return text[:text.rfind("\n")].rstrip() if "\n" in text else ""
