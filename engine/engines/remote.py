"""Engines that call a serving engine over HTTP: an OpenAI-compatible `/completions` (vLLM, SGLang,
llama.cpp's server, llama-cpp-python, LM Studio) or llama.cpp's own `/infill`.

The server cannot tell them from the in-process engine: the same CompletionRequest goes in, the same
streamed pieces and Completion come out, with the same stop rules (engine/text/stops.py). Cancellation
closes the HTTP stream at once, so the server stops generating. While the server cannot be reached
the engine retries with backoff and answers from the fallback engine (the local model) meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from os.path import commonprefix  # of any two strings

from ..protocol import (BackendSpec, Completion, CompletionRequest, Engine, EngineError, EngineInfo, EngineSettings,
                         Stream)
from ..text.fim import PLAIN, detect_template
from ..text.stops import StreamState, stream_pieces
from .sse import EventStream, RemoteError, post_stream

log = logging.getLogger(__name__)

KINDS = ("openai", "llamacpp")
UNREACHABLE = ("unreachable", "timeout")  # the kinds of failure the fallback covers


INFILL_UNSUPPORTED = "Infill is not supported by this model"  # llama.cpp's 501 for a model without FIM tokens


def open_remote_engine(settings: BackendSpec, fallback: Callable[[], Engine] | None = None,
                       session_id: str = "") -> RemoteEngine:
    """A remote engine, with the local tokenizer `settings.tokenizer` names (if any) for token
    budgets and FIM tokens. `session_id`: sent as a header, keeps a user on one replica."""
    tokenizer = None
    if settings.tokenizer:
        from ..loading.torch_load import load_tokenizer  # torch comes with it: only when a tokenizer is named

        tokenizer = load_tokenizer(settings.tokenizer)
    return RemoteEngine(settings, tokenizer, fallback, session_id)


def without_start(pieces: Iterator[str], start: str) -> Iterator[str]:
    """`pieces` with `start` taken off the beginning of their text where they begin with it (as
    much of it as they begin with: an answer may begin with less, or with none, of it)."""
    try:
        for piece in pieces:
            while start and piece and piece[0] == start[0]:
                piece, start = piece[1:], start[1:]
            if piece:
                start = ""  # the answer went on with something else: nothing more to take off
                yield piece
    finally:
        pieces.close()


def session_id(user: str, workspace: str) -> str:
    """A stable, anonymous id for (user, workspace): no names leave the machine."""
    return hashlib.sha256(f"{user}\0{workspace}".encode()).hexdigest()[:16]


class RemoteEngine(Engine):
    def __init__(self, settings: BackendSpec, tokenizer=None, fallback: Callable[[], Engine] | None = None,
                 session_id: str = ""):
        if settings.kind not in KINDS:
            raise EngineError(f"backend.kind {settings.kind!r} is not a remote kind; use one of {', '.join(KINDS)}")
        self.settings = settings
        self.session_id = session_id
        self.tokenizer = tokenizer
        self.template = detect_template(tokenizer.get_vocab()) if tokenizer is not None else PLAIN
        self._fallback_factory = fallback
        self._fallback: Engine | None = None
        self._lock = threading.Lock()
        self.state = "unknown"  # ok | slow (a late first token) | unreachable | error
        self.last_error: str | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.requests = self.cancelled = self.fallback_requests = 0
        self.fallback_reason: str | None = None  # why the last request went to the local model
        self.latencies_ms: deque[float] = deque(maxlen=200)
        self.prefix_shares: deque[float] = deque(maxlen=200)
        self.cached_shares: deque[float] = deque(maxlen=200)
        self._last_prompt = ""
        # llama.cpp's /infill needs a model with FIM tokens; for one without (SmolLM2, say) the
        # prefix goes to /completion instead. Known from the local tokenizer, or learnt from the
        # server's 501 when no tokenizer is named.
        self.infill = tokenizer is None or self.template.has_fim

    # --- the Engine protocol ---------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return (len(text.encode("utf-8")) + 3) // 4  # no tokenizer named: about 4 bytes a token for code

    def stream(self, request: CompletionRequest) -> Stream:
        return Stream(self._generate(request))

    def prefill(self, request: CompletionRequest) -> None:
        return None  # the server's prefix cache does this work when the request comes

    def refresh(self, cancel) -> None:
        return None  # the server reuses nothing approximately that a pause could make exact

    def configure(self, settings: EngineSettings) -> None:
        return None

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()

    def info(self) -> EngineInfo:
        # FIM tokens known from the local tokenizer; without one the prompt is the text before the cursor
        return EngineInfo(self.settings.model or self.settings.url, "remote", "remote", self.template.has_fim)

    def status(self) -> dict:
        lat = sorted(self.latencies_ms)
        fallback = self._fallback.status() if self._fallback is not None else None

        def mean(values) -> float | None:
            return round(sum(values) / len(values), 3) if values else None

        return {
            "model": self.settings.model or self.settings.url, "device": "remote", "dtype": "remote",
            "fim_template": self.template.name, "requests": self.requests,
            "backend": {
                "kind": self.settings.kind, "url": self.settings.url, "model": self.settings.model,
                "state": self.state, "last_error": self.last_error, "failures": self.failures,
                "latency_ms": {"p50": round(lat[len(lat) // 2], 1) if lat else None,
                               "p95": round(lat[int(len(lat) * 0.95)], 1) if lat else None},
                "cancelled": self.cancelled, "fallback_requests": self.fallback_requests,
                "fallback_reason": self.fallback_reason,
                "shared_prefix_share": mean(self.prefix_shares),  # of consecutive prompts, in characters
                "server_cached_share": mean(self.cached_shares),  # where the server reports its cache
                "fallback": fallback,
            },
        }

    # --- one request -----------------------------------------------------------------------------

    def _generate(self, request: CompletionRequest) -> Generator[str, None, Completion]:
        if self.state == "unreachable" and time.monotonic() < self.retry_at:  # backing off: no new try yet
            if self._fallback_factory is None:
                raise RemoteError("unreachable", self.last_error or f"cannot reach {self.settings.url}")
            return (yield from self._from_fallback(request, f"backing off after: {self.last_error}"))
        started = time.perf_counter()
        report: dict = {}
        try:
            events = self._open_learning_infill(request, report)
        except RemoteError as exc:
            self._failed(exc, request)
            if exc.kind in UNREACHABLE and self._fallback_factory is not None:
                return (yield from self._from_fallback(request, str(exc)))
            raise
        watcher = threading.Thread(target=self._close_on_cancel, args=(request, events), daemon=True,
                                   name="memosight-remote-cancel")
        watcher.start()
        state = StreamState(started=started)
        first_token_ms = 0.0
        try:
            pieces = without_start(self._pieces(events, report), report["healed"])
            for piece in stream_pieces(pieces, request.stop, state):
                if request.cancel.is_set():
                    state.stop_reason = "cancelled"
                    break
                if not first_token_ms:
                    first_token_ms = (time.perf_counter() - started) * 1000
                    self.state, self.failures = "ok", 0  # it answers (the server may show that before the stream ends)
                yield piece
        except GeneratorExit:  # the caller closed the stream: so is the connection, below
            self.cancelled += 1
            raise
        except RemoteError as exc:
            if request.cancel.is_set():  # we closed the stream ourselves
                state.stop_reason = "cancelled"
            else:
                self._failed(exc, request)
                if not (first_token_ms == 0.0 and exc.kind in UNREACHABLE and self._fallback_factory is not None):
                    raise
                # Nothing shown yet and the server too slow or gone (a one-slot server busy with a
                # cold prompt answers after the first-token timeout): the local model answers this
                # request too, rather than none at all.
                events.close()
                return (yield from self._from_fallback(request, str(exc)))
        finally:
            events.close()
        if request.cancel.is_set() or state.stop_reason == "cancelled":
            state.stop_reason = "cancelled"
            self.cancelled += 1
        latency = (time.perf_counter() - started) * 1000
        self.state, self.failures = "ok", 0
        self.latencies_ms.append(latency)
        self.requests += 1
        prompt_tokens = int(report.get("prompt_tokens") or 0)
        cached = int(report.get("cached_tokens") or 0)
        if prompt_tokens and "cached_tokens" in report:
            self.cached_shares.append(min(1.0, cached / prompt_tokens))
        return Completion(state.text, state.tokens, prompt_tokens, latency, first_token_ms or latency,
                          state.stop_reason, reused_tokens=cached)

    def _open_learning_infill(self, request: CompletionRequest, report: dict) -> EventStream:
        """_open, and once more on /completion when llama.cpp says the model cannot fill in the middle."""
        try:
            return self._open(request, report)
        except RemoteError as exc:
            if not (self.settings.kind == "llamacpp" and self.infill and INFILL_UNSUPPORTED in str(exc)):
                raise
            log.info("%s has no FIM tokens (%s); sending the prefix to /completion from now on", self.settings.url, exc)
            self.infill = False
            return self._open(request, report)

    def _close_on_cancel(self, request: CompletionRequest, events: EventStream) -> None:
        """Close the HTTP stream the moment the request is cancelled, even mid-read."""
        while not events.closed:
            if request.cancel.wait(0.02):
                events.close()
                return

    def _from_fallback(self, request: CompletionRequest, reason: str) -> Generator[str, None, Completion]:
        with self._lock:
            if self._fallback is None:
                log.info("the backend at %s does not answer (%s); loading the local fallback", self.settings.url,
                         reason)
                self._fallback = self._fallback_factory()
        self.fallback_requests += 1
        self.fallback_reason = reason
        stream = self._fallback.stream(request)
        yield from stream
        return stream.completion

    def _failed(self, exc: RemoteError, request: CompletionRequest) -> None:
        self.failures += 1
        self.last_error = str(exc)
        # A first token later than its timeout is a server that is there but slow (a cold prompt on a
        # CPU): no back-off, the next request asks it again (its prompt cache has grown meanwhile);
        # only one that cannot be reached waits 1 s, 2 s, ... 60 s before the next try.
        self.state = {"unreachable": "unreachable", "timeout": "slow"}.get(exc.kind, "error")
        if self.state != "slow":
            self.retry_at = time.monotonic() + min(60.0, 2.0 ** min(self.failures - 1, 6))
        log.warning("backend %s: %s", self.settings.url, exc)
        if request.on_notice is not None:
            covered = exc.kind in UNREACHABLE and self._fallback_factory is not None
            then = ("the local model answers meanwhile" if covered
                    else "no suggestions from it until it answers again")
            # gone or too slow is one kind for the user: a server stopping shows as either, in turn
            kind = "unreachable" if exc.kind in UNREACHABLE else exc.kind
            request.on_notice(kind, f"the {self.settings.kind} backend failed: {exc}; {then}.")

    # --- the two protocols -----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {}
        if self.session_id:
            headers["X-Session-ID"] = self.session_id
        if self.settings.api_key_env:
            key = os.environ.get(self.settings.api_key_env)
            if not key:
                raise RemoteError("auth", f"the environment variable {self.settings.api_key_env} (backend.api_key_env) "
                                          "is not set; set it to the server's API key")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def render_prompt(self, prefix: str, suffix: str) -> str:
        """The whole prompt as text in the model's own FIM tokens (the prefix alone without them):
        the `suffix` field of /completions means something else on every server."""
        t = self.template
        if not t.has_fim:
            return prefix
        space = " " if t.space_after_prefix_token else ""
        return f"{t.prefix_token}{space}{prefix}{t.suffix_token}{suffix}{t.middle_token}"

    def _stops(self, request: CompletionRequest) -> list[str]:
        stops = (["\n"] if request.stop.single_line else []) + [s for s in request.stop.stop_strings if s]
        return stops[:4]  # OpenAI's limit; the stop rules catch the rest here

    def _open(self, request: CompletionRequest, report: dict) -> EventStream:
        s = self.settings
        base = s.url.rstrip("/")
        # A prompt ending in spaces ends inside what the model writes as one token (" name"): send it
        # without them, and take them off the start of the answer (a whitespace-only token healing)
        prefix = request.prefix.rstrip(" \t")
        report["healed"] = request.prefix[len(prefix):]
        if s.kind == "openai":
            prompt = self.render_prompt(prefix, request.suffix)
            body = {"prompt": prompt, "max_tokens": request.max_new_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            if s.model:
                body["model"] = s.model
            if stops := self._stops(request):
                body["stop"] = stops
            url = f"{base}/completions"
        else:
            body = {"n_predict": request.max_new_tokens, "cache_prompt": True, "stream": True, "temperature": 0,
                    "samplers": ["top_k"], "top_k": 1}
            if self.infill:
                # As llama.vim sends it: the lines above in input_prefix, the cursor's line so far in
                # `prompt`. llama-server joins them again before the suffix (so each key still
                # recomputes the suffix's tokens: keep it short on a CPU, `suffix_share`), but a
                # line's tokens start at the line, whatever the lines above end with.
                line = prefix.rfind("\n") + 1
                prompt = prefix + request.suffix
                body.update({"input_prefix": prefix[:line], "input_suffix": request.suffix, "input_extra": [],
                             "prompt": prefix[line:]})
            else:  # a model without FIM tokens continues the prefix
                prompt = prefix
                body["prompt"] = prefix
            if request.stop.time_budget_ms:
                body["t_max_predict_ms"] = int(request.stop.time_budget_ms)
            if request.stop.block_indent >= 0:
                body["n_indent"] = request.stop.block_indent + 1
            if stops := self._stops(request):
                body["stop"] = stops
            url = f"{base}/infill" if self.infill else f"{base}/completion"
        if self._last_prompt:
            self.prefix_shares.append(len(commonprefix([self._last_prompt, prompt])) / max(1, len(prompt)))
        self._last_prompt = prompt
        return post_stream(url, body, self._headers(), timeout_s=s.timeout_ms / 1000,
                           first_token_timeout_s=s.first_token_timeout_ms / 1000, ca_bundle=s.ca_bundle)

    def _pieces(self, events: EventStream, report: dict) -> Iterator[str]:
        """Text pieces of either protocol's events; the server's token counts land in `report`."""
        try:
            for event in events:
                if self.settings.kind == "openai":
                    usage = event.get("usage") or {}
                    if usage:
                        report["prompt_tokens"] = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            report["cached_tokens"] = details["cached_tokens"]
                    for choice in event.get("choices") or []:
                        if choice.get("text"):
                            yield choice["text"]
                else:
                    if event.get("content"):
                        yield event["content"]
                    if event.get("stop"):
                        timings = event.get("timings") or {}
                        # cache_n: the prompt tokens taken from the slot's cache; tokens_cached
                        # counts the whole slot (prompt and output), so only where cache_n is missing
                        cached = timings.get("cache_n", event.get("tokens_cached"))
                        evaluated = event.get("tokens_evaluated")
                        if evaluated is not None:
                            report["prompt_tokens"] = evaluated
                        if cached is not None:
                            report["cached_tokens"] = cached
                        return
            if not events.done:
                raise RemoteError("unreachable", f"the server at {self.settings.url} closed the connection before "
                                                 "the completion ended")
        finally:
            events.close()
