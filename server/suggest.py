"""The request lifecycle: engine loading, supersede and cancel, typing-through, streaming.

Plain Python with no LSP types, so tests drive it directly; lsp.py only translates. It talks to
the engine only through the engine protocol (memosight.engine.protocol).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from memosight.engine.protocol import (
    CompletionRequest,
    Engine,
    EngineSettings,
    RequestOptions,
)

from .ahead import Ahead
from .completion_cache import CompletionCache, context_key
from .config import Settings
from .context.service import ContextService
from .context.workspace import WorkspaceIndex
from .engine_choice import EngineHolder, load_engine_from_settings
from .documents import Document
from .mode import completion_mode, finished_lines, max_new_tokens, post_process
from .requests import Answer, Counters, Generation, Job, Suggestion, Ticket, rest_after, typed_into
from .timeline import StageStats, Timeline
from .user_messages import UserMessages

log = logging.getLogger(__name__)


class Suggester:
    """A keystroke's request from the editor's ask to the suggestion: typed through, joined or
    generated on the engine thread (EngineHolder), with its context (ContextService), the work done
    ahead of it (Ahead) and what the user is told (UserMessages)."""

    def __init__(self, load_engine: Callable[[Settings], Engine] | None = None, *,
                 open_documents: Callable[[], list[Document]] = list,
                 workspace: Callable[[], WorkspaceIndex | None] = lambda: None, fallback: bool = True,
                 say: Callable[[str], bool] | None = None):
        self._workspace = workspace  # the workspace index: its root, its state in status()
        self.messages = UserMessages(say)  # `say`: a message shown at once, from any thread
        # the server falls back to the defaults and says so; a command-line run says no
        self.engine = EngineHolder(load_engine or (lambda settings: load_engine_from_settings(
            settings, str(getattr(self._workspace(), "root", "") or ""))), self.messages.waiting.append if fallback else None)
        self._jobs: dict[str, Job] = {}
        # every completion computed, for typing along it (typing-through) and for prefetches
        self.completions = CompletionCache()
        self._completions_settings: Settings | None = None  # the settings its completions were made under
        self.counters = Counters()
        self.stages = StageStats()  # where the milliseconds of answered requests went
        self.last_error: str | None = None
        self.context = ContextService(open_documents, workspace)
        self.ahead = Ahead(self.engine, self.context, lambda: self.completions, self.counters, self._run_model,
                           self.ensure_engine)

    # --- engine ---------------------------------------------------------------------------------

    def ensure_engine(self, settings: Settings) -> Future:
        """Start loading the engine that `settings` name, unless it is loaded or loading already."""
        future, started = self.engine.ensure(settings)
        if started:
            self.last_error = None
        return future

    # --- requests -------------------------------------------------------------------------------

    def start_job(self, doc: Document, cursor: int, settings: Settings | None = None) -> Job:
        """A new request for `doc`: it joins the running generation when the user only typed more of
        that generation's text (under the same settings); otherwise the running one is told to stop."""
        old = self._jobs.get(doc.uri)
        job = None
        if old is not None:
            old.superseded = True
            gen = old.generation
            typed = typed_into(gen.text, gen.cursor, doc.text, cursor)
            running = gen.future is not None and not gen.future.done() and not gen.cancel.is_set()
            if running and gen.settings == settings and typed is not None \
                    and rest_after(gen.partial, typed, running=True) is not None:
                job = Job(doc.uri, gen)
                self.counters.joined += 1
            else:
                gen.cancel.set()
        if job is None:
            job = Job(doc.uri, Generation(doc.text, cursor, settings=settings))
        self._jobs[doc.uri] = job
        return job

    def typing_through(self, doc: Document, cursor: int, settings: Settings | None = None) -> str | None:
        """The rest of a completion computed earlier (shown or not, prefetched or asked for) that
        the text before the cursor types into; see completion_cache.py. Completions made under
        other settings (another model, length, mode) are forgotten first."""
        if settings is not None and settings != self._completions_settings:
            self.completions = CompletionCache()
            self._completions_settings = settings
        hit = self.completions.lookup(doc.uri, doc.text, cursor)
        return None if hit is None else hit.rest

    # --- work ahead of the request (server/ahead.py) ----------------------------------------------

    def warm(self, doc: Document, cursor: int, settings: Settings) -> None:
        self.ahead.warm(doc, cursor, settings)

    def forget(self, uri: str) -> None:
        """Drop what is kept for a document (closed, or a fresh request is wanted)."""
        self.completions.forget(uri)
        self.ahead.forget(uri)
        job = self._jobs.pop(uri, None)  # a cancelled generation still running holds the text
        if job is not None:
            job.generation.cancel.set()

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
        # 1. Typed along a completion computed before (shown or not): its rest, no model call.
        if (rest := self._typed_through(ticket, settings, timeline, started)) is not None:
            return rest
        # 2. The engine is this request's now: warm-ups and prefetches for other text stop.
        self._make_way(ticket)
        # 3. Join the running generation the user typed into, or start one on the engine thread.
        job = self.start_job(ticket.seen, ticket.cursor, settings)
        try:
            suggestion = await self._run_or_join(job, ticket, settings, on_partial, cold, timeline)
        except asyncio.CancelledError:
            # The editor cancels a request when the user types on. The generation goes on (bounded by
            # max_new_tokens and the latency budget): a later request typed into it joins it, its
            # completion lands in the completion cache for typing along it, and a request for other
            # text stops it (start_job). Stopping it here, a model slower than the typist's keys never
            # finished one (measured: Qwen2.5-Coder-0.5B on llama-server, 0 characters saved).
            timeline.kind = "cancelled"
            self.counters.cancelled += 1
            raise
        finally:
            gen = job.generation
            if self._jobs.get(job.uri) is job and (gen.future is None or gen.future.done()):
                del self._jobs[job.uri]
        # 4. The answer: none for a request overtaken by another; what was typed since, dropped.
        if job.superseded or job.generation.cancel.is_set():
            return self._finish_cancelled(job)
        return self._answer(suggestion, ticket, started)

    def _typed_through(self, ticket: Ticket, settings: Settings, timeline: Timeline,
                       started: float) -> Suggestion | None:
        rest = self.typing_through(ticket.seen, ticket.cursor, settings)
        if rest is None:
            return None
        old = self._jobs.pop(ticket.doc.uri, None)
        if old is not None:
            old.superseded = True
            old.generation.cancel.set()
        self.counters.typed_through += 1
        timeline.kind = "typed_through"
        timeline.mark("handler")
        latency = (time.perf_counter() - started) * 1000
        self.counters.answered(rest, latency)
        return Suggestion(rest, ticket.cursor, latency, 0, "typed_through")

    def _make_way(self, ticket: Ticket) -> None:
        """The request prefills the rest of its own warm-up itself, from where it stopped; the others'
        (an edit in a big file a moment ago) must not hold the engine while the user waits. A
        prefetch of exactly this text goes on: the request waits for it and finds it in the cache."""
        self.ahead.stop_warm_ups()
        text, cursor = ticket.seen.text, ticket.cursor
        self.ahead.stop_prefetch(ticket.doc.uri, unless_at=context_key(ticket.doc.uri, text, cursor))

    async def _run_or_join(self, job: Job, ticket: Ticket, settings: Settings, on_partial, cold: bool,
                           timeline: Timeline) -> Suggestion | None:
        gen = job.generation
        if gen.future is None:
            # shield: cancelling this request must not cancel the shared engine load
            engine = await asyncio.shield(asyncio.wrap_future(self.ensure_engine(settings)))
            if gen.cancel.is_set():
                return None
            timeline.mark("handler")
            gen.future = self.engine.submit(self._generate, engine, ticket, settings, gen, on_partial,
                                            asyncio.get_running_loop(), cold, timeline)
        else:
            timeline.mark("handler")
            timeline.kind = "joined"
        suggestion = await self._first_answer(gen, ticket.seen.text, ticket.cursor, timeline)
        if timeline.kind == "joined":
            timeline.mark("joined")
        return suggestion

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

    def _finish_cancelled(self, job: Job) -> None:
        if job.superseded:
            self.counters.superseded += 1
        else:
            self.counters.cancelled += 1
        return None

    def _generate(self, engine: Engine, ticket: Ticket, settings: Settings, gen: Generation, on_partial, loop,
                  cold: bool, timeline: Timeline) -> Suggestion | None:
        """Runs on the engine thread: context, generation, post-processing."""
        timeline.mark("engine_wait")
        if gen.cancel.is_set() or ticket.stale():
            return None
        start = time.perf_counter()
        # the document as it is now, and stays: the event loop goes on applying edits to the live one
        doc, cursor = ticket.doc.frozen(), ticket.cursor
        if doc.text is not ticket.seen.text:
            return None
        hit = self.completions.lookup(doc.uri, doc.text, cursor)
        if hit is not None:  # a prefetch for this very text finished while the request waited for it
            timeline.kind = "cached"
            return Suggestion(hit.rest, cursor, (time.perf_counter() - start) * 1000, 0, "cached")
        text, completion = self._run_model(engine, doc, cursor, settings, gen.cancel, cold, timeline,
                                           on_piece=None if on_partial is None else
                                           lambda partial: loop.call_soon_threadsafe(on_partial, partial),
                                           gen=gen, stale=ticket.stale)
        if completion is None:  # an edit arrived while the context was built
            return None
        if completion.stop_reason != "cancelled":
            self.completions.put(doc.uri, doc.text, cursor, text)
        latency = (time.perf_counter() - start) * 1000
        log.debug("completion %s:%d %.1f ms (first piece %.1f ms) prompt %d tokens (%d cached), %d new, stop %s",
                  doc.uri.rsplit("/", 1)[-1], cursor, latency, completion.first_token_ms, completion.prompt_tokens,
                  completion.reused_tokens, completion.tokens, completion.stop_reason)
        suggestion = Suggestion(text, cursor, latency, completion.prompt_tokens, completion.stop_reason)
        gen.first_lines.cancel()  # never set (one line, or none): the requests take the whole run
        timeline.mark("post")
        return suggestion

    def _run_model(self, engine: Engine, doc: Document, cursor: int, settings: Settings, cancel: threading.Event,
                   cold: bool = False, timeline: Timeline | None = None, on_piece=None, gen: Generation | None = None,
                   stale: Callable[[], bool] | None = None):
        """On the engine thread: the context at `cursor`, the model's completion, post-processed.
        (text, Completion); ("", None) when `gen`'s request went stale while its context was built."""
        timeline = timeline if timeline is not None else Timeline()
        # Settings that change without reloading the model; an engine makes repeating them cheap.
        engine.configure(EngineSettings(speculative=settings.speculative,
                                        kv_cache_bytes=settings.kv_cache_mb * 2**20))
        view, view_cursor = doc.around(cursor)  # a large file: a window of it
        stop, multiline = completion_mode(view, view_cursor, settings)
        context = self.context.for_request(engine, view, view_cursor, settings, timeline)
        timeline.mark("context")
        if stale is not None and stale():
            return "", None
        request = CompletionRequest(context.prefix, context.suffix, doc.language, max_new_tokens(settings, multiline),
                                    stop, cancel, RequestOptions(cold=cold, heal=settings.token_healing),
                                    on_notice=self.messages.notice)
        stream = engine.stream(request)
        text = ""
        started = time.perf_counter()
        try:
            for piece in stream:
                text += piece
                if gen is not None:
                    gen.partial = text
                    # the finished lines change only when a piece brings a newline
                    if multiline and "\n" in piece and not gen.first_lines.done() \
                            and (lines := finished_lines(text)).strip():
                        gen.first_lines.set_result(Suggestion(
                            post_process(lines, multiline), cursor, (time.perf_counter() - started) * 1000,
                            0, "first_line"))
                if on_piece is not None and not cancel.is_set():
                    on_piece(text)
        finally:
            stream.close()  # whatever happened here, the engine is free for the next request
        completion = stream.result()
        timeline.split(completion.stages_ms, "engine")
        timeline.steps = completion.steps
        timeline.tokens, timeline.prompt_tokens = completion.tokens, completion.prompt_tokens
        timeline.stop_reason = completion.stop_reason
        return post_process(completion.text, multiline), completion

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
        out = {"state": state, "model": settings.model or "default", "device": None, "dtype": None,
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
        return {"jobs": len(self._jobs), **self.ahead.memory(), "context_caches": self.context.compressor.cache_entries()}

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
        for job in self._jobs.values():
            job.generation.cancel.set()
        self.ahead.stop_warm_ups()
        self.ahead.stopped = True  # and no more work ahead of requests
