"""The request lifecycle: engine loading, supersede and cancel, completion mode, post-processing.

Plain Python with no LSP types, so tests drive it directly; lsp.py only translates.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from memosight.engine.request import CompletionRequest, StopRule

from .config import Settings
from .context.packing import PackedContext, truncate_around_cursor
from .documents import Document

log = logging.getLogger(__name__)

BLOCK_OPENERS = {"python": (":",), "": ("{", ":")}
BRACE_LANGUAGES_OPENERS = ("{", "(", "[", "=>")


@dataclass
class Suggestion:
    text: str
    offset: int  # where it is inserted, as a string offset in the document
    latency_ms: float
    prompt_tokens: int
    stop_reason: str


@dataclass
class Job:
    uri: str
    cancel: threading.Event = field(default_factory=threading.Event)
    superseded: bool = False


@dataclass
class Counters:
    requests: int = 0
    completed: int = 0
    empty: int = 0
    cancelled: int = 0
    superseded: int = 0
    accepted: int = 0
    accepted_chars: int = 0
    errors: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=500))

    def to_json(self) -> dict:
        lat = sorted(self.latencies_ms)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(len(lat) * q))], 2)) if lat else (lambda q: None)
        return {
            "requests": self.requests, "completed": self.completed, "empty": self.empty,
            "cancelled": self.cancelled, "superseded": self.superseded, "accepted": self.accepted,
            "accepted_chars": self.accepted_chars, "errors": self.errors,
            "latency_ms": {"last": round(lat and self.latencies_ms[-1] or 0, 2) if lat else None,
                           "p50": pick(0.5), "p95": pick(0.95)},
            "acceptance_rate": round(self.accepted / self.completed, 4) if self.completed else None,
        }


def completion_mode(doc: Document, cursor: int, settings: Settings) -> tuple[StopRule, bool]:
    """The stop rule for a completion at `cursor`, and whether it may span several lines.

    Single line mid-line; several lines after a block opener, or on a blank line right below one,
    stopping at the end of that block.
    """
    text = doc.text
    line_start = text.rfind("\n", 0, cursor) + 1
    line_end = text.find("\n", cursor)
    line_end = len(text) if line_end == -1 else line_end
    before, after = text[line_start:cursor], text[cursor:line_end].rstrip("\r")
    following = text[line_end + 1:].split("\n", 40)
    next_line = next((line.rstrip("\r") for line in following[:40] if line.strip()), "")
    multiline = settings.multiline == "always"
    opener_line = before
    if settings.multiline == "auto" and not after.strip():
        if not before.strip():  # blank line: look at the line above
            above = text[:line_start].rstrip("\r\n").rsplit("\n", 1)[-1]
            opener_line = above
        openers = (":",) if doc.language == "python" else BRACE_LANGUAGES_OPENERS
        multiline = opener_line.rstrip().endswith(openers)
    if not multiline:
        return StopRule(single_line=True, suffix_line=after), False
    indent = len(opener_line) - len(opener_line.lstrip(" \t"))
    return StopRule(suffix_line=after, next_suffix_line=next_line, block_indent=indent,
                    stop_strings=("\n\n\n",)), True


def post_process(text: str, multiline: bool) -> str:
    """Final tidy-up: no trailing whitespace, no dangling blank lines."""
    text = text.rstrip()
    return text if multiline else text.split("\n", 1)[0]


class Suggester:
    """Owns the engine (loaded in the background) and runs one generation at a time."""

    def __init__(self, load_engine: Callable[[Settings], object] | None = None):
        self._load_engine = load_engine or _load_engine_from_settings
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memosight-engine")
        self._engine_future: Future | None = None
        self._engine_key: tuple | None = None
        self._jobs: dict[str, Job] = {}
        self.counters = Counters()
        self.load_error: str | None = None

    # --- engine ---------------------------------------------------------------------------------

    def ensure_engine(self, settings: Settings) -> Future:
        """Start loading the engine that `settings` name, unless it is loaded or loading already."""
        key = (settings.model, settings.device, settings.dtype)
        if self._engine_future is None or key != self._engine_key:
            self._engine_key = key
            self.load_error = None
            self._engine_future = self._executor.submit(self._load_engine, settings)
        return self._engine_future

    def engine_if_ready(self):
        f = self._engine_future
        if f is not None and f.done() and f.exception() is None:
            return f.result()
        return None

    # --- requests -------------------------------------------------------------------------------

    def supersede(self, uri: str) -> Job:
        """A new request for `uri`: the running one (if any) is told to stop."""
        old = self._jobs.get(uri)
        if old is not None:
            old.superseded = True
            old.cancel.set()
        job = Job(uri)
        self._jobs[uri] = job
        return job

    def build_context(self, engine, doc: Document, cursor: int, settings: Settings) -> PackedContext:
        return truncate_around_cursor(doc.text, cursor, settings.context_budget, settings.suffix_share,
                                      engine.count_tokens, doc.path)

    async def suggest(self, doc: Document, cursor: int, settings: Settings,
                      on_partial: Callable[[str], None] | None = None) -> Suggestion | None:
        """The suggestion at `cursor`, or None when there is none (superseded, cancelled, empty).

        Raises asyncio.CancelledError when the client cancelled the request.
        """
        self.counters.requests += 1
        job = self.supersede(doc.uri)
        loop = asyncio.get_running_loop()
        try:
            engine = await asyncio.wrap_future(self.ensure_engine(settings))
            if job.cancel.is_set():
                return self._finish_cancelled(job)
            future = self._executor.submit(self._generate, engine, doc, cursor, settings, job, on_partial, loop)
            suggestion = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            job.cancel.set()
            self.counters.cancelled += 1
            raise
        finally:
            if self._jobs.get(doc.uri) is job:
                del self._jobs[doc.uri]
        if job.cancel.is_set():
            return self._finish_cancelled(job)
        if suggestion is None or not suggestion.text:
            self.counters.empty += 1
            return None
        self.counters.completed += 1
        self.counters.latencies_ms.append(suggestion.latency_ms)
        return suggestion

    def _finish_cancelled(self, job: Job) -> None:
        if job.superseded:
            self.counters.superseded += 1
        else:
            self.counters.cancelled += 1
        return None

    def _generate(self, engine, doc: Document, cursor: int, settings: Settings, job: Job,
                  on_partial, loop) -> Suggestion | None:
        """Runs on the engine thread: context, generation, post-processing."""
        if job.cancel.is_set():
            return None
        start = time.perf_counter()
        apply_engine_settings(engine, settings)
        stop, multiline = completion_mode(doc, cursor, settings)
        context = self.build_context(engine, doc, cursor, settings)
        request = CompletionRequest(context.prefix, context.suffix, doc.language, settings.max_new_tokens,
                                    stop, job.cancel)
        result: dict = {}
        text = ""
        for piece in engine.stream(request, result):
            text += piece
            if on_partial is not None and not job.cancel.is_set():
                loop.call_soon_threadsafe(on_partial, text)
        completion = result["completion"]
        latency = (time.perf_counter() - start) * 1000
        return Suggestion(post_process(completion.text, multiline), cursor, latency,
                          completion.prompt_tokens, completion.stop_reason)

    def record_accepted(self, chars: int) -> None:
        self.counters.accepted += 1
        self.counters.accepted_chars += max(0, chars)

    def status(self, settings: Settings) -> dict:
        engine = self.engine_if_ready()
        state = "ready" if engine is not None else ("error" if self.load_error else "loading")
        out = {"state": state, "model": settings.model or "default", "device": None, "dtype": None,
               "error": self.load_error, "requests": self.counters.to_json()}
        if engine is not None:
            out.update({k: v for k, v in engine.status().items() if k != "requests"})
            out["model"] = engine.name
        return out

    def shutdown(self) -> None:
        for job in self._jobs.values():
            job.cancel.set()
        self._executor.shutdown(wait=False, cancel_futures=True)


def apply_engine_settings(engine, settings: Settings) -> None:
    """Settings that change without reloading the model; engines without these knobs ignore them."""
    if hasattr(engine, "speculative"):
        engine.speculative = settings.speculative
    tree = getattr(getattr(engine, "prompt_cache", None), "prefix_tree", None)
    if tree is not None and tree.max_bytes != settings.kv_cache_mb * 2**20:
        engine.set_kv_cache_bytes(settings.kv_cache_mb * 2**20)


def _load_engine_from_settings(settings: Settings):
    from memosight.engine import load_engine

    return load_engine(settings.model, device=settings.device, dtype=settings.dtype)
