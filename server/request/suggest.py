"""The request lifecycle: engine loading, supersede and cancel, typing-through, streaming.

Plain Python with no LSP types, so tests drive it directly; lsp.py only translates. It talks to
the engine only through the engine protocol (memosight.engine.protocol).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from ..config import Settings
from ..context.service import ContextService
from ..context.workspace import WorkspaceIndex
from ..documents import Document
from . import engine_choice
from .ahead import Ahead
from .completion_cache import CompletionCache
from .engine_choice import EngineHolder, Load
from .records import Answer, Counters, Generation, Suggestion, Ticket, rest_after
from .runs import Runs
from .timeline import StageStats, Timeline
from .user_messages import UserMessages

log = logging.getLogger(__name__)


class Suggester:
    """A keystroke's request from the editor's ask to the suggestion: typed through, joined or
    run on the engine thread (EngineHolder, runs.py), with its context (ContextService), the work
    done ahead of it (Ahead) and what the user is told (UserMessages)."""

    def __init__(self, load_engine: Load | None = None, *,
                 open_documents: Callable[[], list[Document]] = list,
                 workspace: Callable[[], WorkspaceIndex | None] = lambda: None, fallback: bool = True,
                 say: Callable[[str], bool] | None = None):
        self._workspace = workspace  # the workspace index: its root, its state in status()
        self.messages = UserMessages(say)  # `say`: a message shown at once, from any thread
        # the server falls back to the defaults and says so; a command-line run says no
        self.engine = EngineHolder(load_engine or engine_choice.load, self.messages.waiting.append if fallback else None)
        self._asking: dict[str, Ticket] = {}  # uri -> its latest request, until answered: the others are overtaken
        # every completion computed, for typing along it (typing-through) and for prefetches
        self.completions = CompletionCache()
        self.counters = Counters()
        self.stages = StageStats()  # where the milliseconds of answered requests went
        self.last_error: str | None = None
        self.context = ContextService(open_documents, workspace)
        self.runs = Runs(self.engine, self.context, self.completions, self.counters, self.messages.notice)
        self.ahead = Ahead(self.engine, self.runs, self.completions, self.counters, self.ensure_engine)

    # --- engine ---------------------------------------------------------------------------------

    def ensure_engine(self, settings: Settings) -> Future:
        """Start loading the engine that `settings` name, unless it is loaded or loading already."""
        root = getattr(self._workspace(), "root", None)  # a remote backend's session comes from it
        future, started = self.engine.ensure(dataclasses.replace(settings.engine, workspace=str(root or "")))
        if started:
            self.last_error = None
        return future

    # --- work ahead of the request (server/request/ahead.py) ----------------------------------------------

    def warm(self, doc: Document, cursor: int, settings: Settings) -> None:
        self.ahead.warm(doc, cursor, settings)

    def forget(self, uri: str) -> None:
        """Drop what is kept for a document (closed, or a fresh request is wanted)."""
        self.completions.forget(uri)
        self.ahead.forget(uri)
        self.runs.stop(uri)  # a cancelled run still going holds the text
        self._asking.pop(uri, None)

    # --- the request ------------------------------------------------------------------------------

    async def suggest(self, ticket: Ticket, settings: Settings,
                      on_partial: Callable[[str], None] | None = None, *, cold: bool = False,
                      timeline: Timeline | None = None) -> Answer:
        """The suggestion at the ticket's cursor, in the text it saw (`Ticket.of(doc, cursor)`, taken
        when the request arrived: later edits never move its answer), with any messages for the user.
        An engine that fails is reported in the messages; the request then gets no suggestion.

        Raises asyncio.CancelledError when the client cancelled the request. `cold` asks the engine
        to forget its caches first (cold-start measurements). `timeline` collects where the time
        goes (see timeline.py); the caller ends it once the answer is written.
        """
        timeline = timeline if timeline is not None else Timeline()
        try:
            suggestion = await self._keystroke(ticket, settings, on_partial, cold, timeline)
            if suggestion is not None and suggestion.stop_reason != "first_line":  # else: its run goes on
                self.ahead.prefetch(ticket, suggestion.text, settings)
        except Exception as exc:  # not CancelledError: that is the client's cancel, and propagates  # noqa: BLE001 - the server answers every request and stays up
            log.exception("completion failed")
            self.counters.errors += 1
            self.last_error = str(exc)
            self.messages.failure(getattr(exc, "kind", None) or str(exc), str(exc))
            suggestion = None
        timeline.mark("resume")
        if suggestion is None and timeline.kind != "cancelled":
            timeline.kind = "empty"
        return Answer(suggestion, ticket.seen, self.messages.take())

    async def _keystroke(self, ticket: Ticket, settings: Settings, on_partial, cold: bool,
                         timeline: Timeline) -> Suggestion | None:
        """A keystroke's request, step by step."""
        self.counters.requests += 1
        started = time.perf_counter()
        # 1. Typed along a completion computed before (shown or not, asked for or prefetched): its
        #    rest, no model call. The one lookup of the completion cache.
        if (rest := self._typed_through(ticket, settings, timeline, started)) is not None:
            return rest
        # 2. The engine is this request's now: warm-ups for other text stop (another's must not hold
        #    the engine); its own goes on, since it computes this very prompt.
        self.ahead.stop_warm_ups(keep=ticket)
        # 3. Join the document's run the user typed along (a request's, a prefetch's), or start one,
        #    and wait for its first answer (the engine loads first, if it must).
        gen = self._run_for(ticket, settings)
        try:
            suggestion = await self._run_or_join(gen, ticket, on_partial, cold, timeline)
        except asyncio.CancelledError:
            # The editor cancels a request when the user types on. The run goes on (bounded by
            # max_new_tokens and the latency budget): a later request typed into it joins it, its
            # completion lands in the completion cache for typing along it, and a request for other
            # text stops it. Stopping it here, a model slower than the typist's keys never finished
            # one (measured: Qwen2.5-Coder-0.5B on llama-server, 0 characters saved).
            timeline.kind = "cancelled"
            self.counters.cancelled += 1
            raise
        finally:
            overtaken = self._asking.get(ticket.seen.uri) is not ticket
            if not overtaken:
                del self._asking[ticket.seen.uri]
            self.runs.drop_unstarted(ticket.seen.uri, gen)  # it holds the text it was made for
        # 4. The answer: none for a request overtaken by another; what was typed since, dropped.
        if overtaken or gen.cancel.is_set():
            return self._finish_cancelled(overtaken)
        return self._answer(suggestion, ticket, started)

    def _typed_through(self, ticket: Ticket, settings: Settings, timeline: Timeline,
                       started: float) -> Suggestion | None:
        """The rest of a completion computed earlier that the text before the cursor types into
        (completion_cache.py). Completions made under other settings are forgotten first."""
        self.completions.made_under(settings)
        hit = self.completions.lookup(ticket.seen.uri, ticket.seen.text, ticket.cursor)
        if hit is None:
            return None
        self._asking.pop(ticket.seen.uri, None)  # an earlier request still waiting is overtaken
        self.runs.stop(ticket.seen.uri, source="request")  # a prefetch goes on: the Tab after this
        self.counters.typed_through += 1
        timeline.kind = "typed_through"
        timeline.mark("handler")
        latency = (time.perf_counter() - started) * 1000
        self.counters.answered(hit.rest, latency)
        return Suggestion(hit.rest, ticket.cursor, latency, 0, "typed_through")

    def _run_for(self, ticket: Ticket, settings: Settings) -> Generation:
        """The run this request waits for, now the document's latest request (an earlier one still
        waiting is overtaken): the document's run when the user only typed along it (under the same
        settings); otherwise a new one, and the one before it stops."""
        self._asking[ticket.seen.uri] = ticket
        gen = self.runs.joinable(ticket.seen.uri, ticket.seen.text, ticket.cursor, settings)
        if gen is not None:
            self.counters.joined += 1
            return gen
        return self.runs.start(ticket, settings)

    async def _run_or_join(self, gen: Generation, ticket: Ticket, on_partial, cold: bool,
                           timeline: Timeline) -> Suggestion | None:
        if gen.future is None:
            # shield: cancelling this request must not cancel the shared engine load
            engine = await asyncio.shield(asyncio.wrap_future(self.ensure_engine(gen.settings)))
            if gen.cancel.is_set():
                return None
            timeline.mark("handler")
            self.runs.submit(gen, engine, ticket, cold=cold, timeline=timeline,
                             on_piece=None if on_partial is None else self._streamed(on_partial))
        else:
            timeline.mark("handler")
            timeline.kind = "joined"
        suggestion = await self._first_answer(gen, ticket.seen.text, ticket.cursor, timeline)
        if timeline.kind == "joined":
            timeline.mark("joined")
        return suggestion

    def _streamed(self, on_partial: Callable[[str], None]) -> Callable[[str], None]:
        """The engine thread's pieces for `on_partial`, on the event loop, each counted as shown."""
        loop, first = asyncio.get_running_loop(), True

        def shown(partial: str) -> None:
            nonlocal first
            self.counters.streaming(partial, first)
            first = False
            on_partial(partial)
        return lambda partial: loop.call_soon_threadsafe(shown, partial)

    def _answer(self, suggestion: Suggestion | None, ticket: Ticket, started: float) -> Suggestion | None:
        text, cursor = ticket.seen.text, ticket.cursor
        if suggestion is not None and suggestion.offset != cursor:  # joined: drop what was typed since
            rest = rest_after(suggestion.text, text[suggestion.offset:cursor])
            suggestion = None if rest is None else Suggestion(
                rest, cursor, (time.perf_counter() - started) * 1000, suggestion.prompt_tokens, suggestion.stop_reason)
        if suggestion is None or not suggestion.text:
            self.counters.empty += 1
            return None
        self.last_error = None  # an error of an earlier request is no longer the state of things
        self.counters.answered(suggestion.text, suggestion.latency_ms)
        return suggestion

    async def _first_answer(self, gen: Generation, text: str, cursor: int, timeline: Timeline) -> Suggestion | None:
        """What `gen` gives the request at (`text`, `cursor`) first: the finished run, or, while a
        multi-line run goes on, its first line(s) when they still extend what was typed since. The
        user reads a line sooner than a block; the rest is there after Tab (joined, or cached)."""
        full = asyncio.wrap_future(gen.future)
        early = asyncio.wrap_future(gen.first_lines)
        # asyncio.wait does not cancel what it waits on: a cancelled request leaves the shared run alone
        done, _ = await asyncio.wait({full, early}, return_when=asyncio.FIRST_COMPLETED)
        if full not in done and not early.cancelled() and (first := early.result()) is not None:
            if rest_after(first.text, text[first.offset:cursor]) is not None:
                timeline.kind = "first_line"
                self.counters.first_lines += 1
                return first
        # shield: a request that is cancelled must not cancel the shared generation's future
        return await asyncio.shield(full)

    def _finish_cancelled(self, overtaken: bool) -> None:
        if overtaken:
            self.counters.superseded += 1
        else:
            self.counters.cancelled += 1

    def record_timeline(self, timeline: Timeline, request_id=None) -> None:
        """A request's answer was written: its stages go into the running figures and the log."""
        timeline.end()
        self.stages.add(timeline, request_id)
        log.debug("request %s %s", request_id, timeline.log_line())

    def record_accepted(self, chars: int) -> None:
        """The client says it took `chars` characters of a suggestion (memosight.accepted)."""
        self.counters.accept(chars)

    def status(self, settings: Settings) -> dict:
        engine = self.engine.ready()
        state = "ready" if engine is not None else ("error" if self.last_error else "loading")
        if self.ahead.stopped:  # after the LSP shutdown request
            state = "stopped"
        out = {"state": state, "model": settings.engine.model or "default", "device": None, "dtype": None,
               "error": self.last_error, "requests": self.counters.to_json(), "breakdown": self.stages.to_json(),
               "completion_cache": self.completions.to_json(), "notices": dict(self.messages.notices)}
        if engine is not None:
            out.update({k: v for k, v in engine.status().items() if k != "requests"})
        index = self._workspace()
        out["workspace"] = None if index is None else {
            "root": str(index.root), "files": len(index), "indexed": index.ready.is_set()}
        return out

    def memory(self) -> dict:
        """What the request side holds: runs kept per document, work ahead, the context's caches."""
        return {"requests_waiting": len(self._asking), "runs": len(self.runs), **self.ahead.memory(),
                "context_caches": self.context.compressor.cache_entries()}

    def close(self) -> None:
        """For a command that exits next: stop, wait for the engine thread, and close the engine on
        this thread."""
        self._stop_all()
        self.engine.close(wait=True)

    def shutdown(self) -> None:
        """The LSP shutdown: stop, and let the engine go without waiting for it."""
        self._stop_all()
        self.engine.close(wait=False)

    def _stop_all(self) -> None:
        self.runs.stop_all()
        self.ahead.stop_warm_ups()
        self.ahead.close()  # and no more work ahead of requests
