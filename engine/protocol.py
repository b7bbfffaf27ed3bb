"""The one door between the server and the engine: the records that cross it and the Engine protocol.

The server imports this module (and `load_engine`) and nothing else of the engine, so no torch here.
Every engine implements `Engine`: the in-process one (local.py), the test double in the tests, and
engines that call a serving engine over HTTP.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class EngineError(RuntimeError):
    """A problem the user can fix (a missing model folder, an unknown device); the message says how."""


class ModelLoadError(EngineError):
    """A model could not be loaded; the message names the model and how to fix it."""


@dataclass(frozen=True)
class StopRule:
    """Where a completion must end, besides EOS and the token limit."""

    single_line: bool = False  # stop at the first newline (the newline is not part of the text)
    suffix_line: str = ""  # the rest of the cursor's line: never generate it again
    next_suffix_line: str = ""  # the first non-blank line after the cursor: stop before repeating it
    stop_strings: tuple[str, ...] = ()  # extra strings that end the completion (not included)
    block_indent: int = -1  # multi-line: a later non-blank line indented this much or less ends the block
    # Multi-line: once this many milliseconds have passed since the request started, end at the last
    # complete line; a single line: this long after its first token, end where it got to (0 = no
    # budget). A shorter suggestion now beats a longer one late.
    time_budget_ms: float = 0.0
    # End before the first token the model gives less than this probability (0 = never): the rest
    # of a line the model is unsure of is mostly wrong, and costs a decoding step a token. In-process
    # engines only; a first token under it means no suggestion at all.
    min_confidence: float = 0.0
    # The cursor's line has spaces or tabs right before the cursor (an indentation, `x = `): the
    # suggestion's own leading ones are dropped, or the editor would show them doubled and misaligned
    # (token healing lets a model choose a longer whitespace token than the one it cut).
    after_whitespace: bool = False


@dataclass(frozen=True)
class RequestOptions:
    """Per-request choices that are not about the text."""

    cold: bool = False  # forget cached prompts and drafts first (cold-start measurements)
    heal: bool = True  # token healing: end the prompt at a token boundary, generate the cut text first
    fim: bool = True  # the model's fill-in-the-middle prompt where it has one; False: the prefix alone


@dataclass
class CompletionRequest:
    prefix: str  # the (packed) text before the cursor
    suffix: str = ""  # the (packed) text after it
    language: str = ""  # the document's language id, for engines that use it (and their logs)
    max_new_tokens: int = 64
    stop: StopRule = field(default_factory=StopRule)
    # Set by the server when the request is superseded or cancelled; checked between decode steps.
    cancel: threading.Event = field(default_factory=threading.Event)
    options: RequestOptions = field(default_factory=RequestOptions)
    # Called, on the engine's thread, when the engine cannot serve the request as configured (a
    # backend that is down, too slow or failing): (kind of failure, what happened and what to do).
    # It is called as soon as that is known, before any fallback answers, so the user hears it at once.
    on_notice: Callable[[str, str], None] | None = None

    def __post_init__(self) -> None:
        self.prefix, self.suffix = valid_text(self.prefix), valid_text(self.suffix)


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """Text every tokenizer and UTF-8 encoder takes. A JSON client can send lone surrogates
    ("\\ud800"); each becomes U+FFFD, one character for one, so offsets still hold."""
    return LONE_SURROGATE.sub("\ufffd", text) if not text.isascii() else text


@dataclass
class Completion:
    """What one request produced, with the figures the status and benchmarks report."""

    text: str  # as the stop rules cut it, never ending in blanks: what the user is shown
    tokens: int  # new tokens generated (including any cut by the stop rules)
    prompt_tokens: int
    latency_ms: float  # request start to last token
    first_token_ms: float
    # "eos" | "max_tokens" | "newline" | "suffix" | "stop_string" | "block_end" | "cancelled" | "time_budget"
    # | "unsure" (min_confidence)
    stop_reason: str
    reused_tokens: int = 0  # prompt tokens served from the KV cache instead of prefilled
    # Where latency_ms went, in ms, in the order it happened: for the in-process engine "render"
    # (FIM template, tokenizer, healing), "kv_lookup", "prefill", "decode", "stop_rule" (detokenizing
    # and the stop rules); they add up to latency_ms. A remote engine reports what it can see.
    stages_ms: dict[str, float] = field(default_factory=dict)
    # each decoding step: (draft nodes verified, drafts accepted, ms drafting, ms in all)
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)


class Stream(Iterator[str]):
    """Text pieces as the engine accepts tokens; once exhausted, `completion` holds the result.

    Wraps a generator that yields the pieces and returns the Completion. Closing the stream early
    (or dropping it) ends the generation and frees the engine.
    """

    def __init__(self, pieces: Generator[str, None, Completion]):
        self._pieces = pieces
        self._finished = False
        self.completion: Completion | None = None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> str:
        if self._finished:
            raise StopIteration
        try:
            return next(self._pieces)
        except StopIteration as done:
            self.completion, self._finished = done.value, True
            raise

    def close(self) -> None:
        """End the generation early (a no-op once it is over); the engine is free again."""
        self._finished = True
        self._pieces.close()

    def result(self) -> Completion:
        """Read the rest of the stream and return its Completion."""
        for _ in self:
            pass
        if self.completion is None:  # closed before its end: the engine never finished it
            raise EngineError("the completion was closed before it ended")
        return self.completion


@dataclass(frozen=True)
class EngineSettings:
    """Everything the server sets on a running engine, in one call (no reload needed)."""

    speculative: bool = True  # speculative decoding (the same tokens as greedy, faster)
    kv_cache_bytes: int = 256 * 2**20  # memory bound of the cache of earlier prompts
    # every prompt computed exactly; else a keystroke moves the cells of text that only moved (the
    # FIM suffix behind the typed text) past their first tokens, made exact when the user pauses
    exact_prompt: bool = False


@dataclass(frozen=True)
class BackendSpec:
    """Where the model runs: in this process ("local"), or on a serving engine over HTTP. The
    server's `[backend]` setting is this type."""

    kind: str = "local"  # local | openai | llamacpp
    url: str = ""  # base URL: http://gpu-box:8000/v1 (openai), http://gpu-box:8080 (llamacpp)
    model: str = ""  # the server's model name, where it needs one
    tokenizer: str = ""  # local tokenizer (folder, hub id in the cache, .gguf): budgets and FIM tokens
    api_key_env: str = ""  # the NAME of an environment variable that holds the key; never the key
    timeout_ms: int = 4000  # the whole request
    first_token_timeout_ms: int = 2000
    ca_bundle: str = ""  # extra CA file for a server with its own certificate authority
    fallback: str = "local"  # local | none: what answers while the server cannot be reached

    @property
    def remote(self) -> bool:
        return self.kind != "local"


@dataclass(frozen=True)
class EngineSpec:
    """Which engine to load, as one value: the model and how it runs, or the serving engine to call.
    `load_engine(spec)` takes it; the server's settings give it (Settings.engine_spec)."""

    model: str | None = None  # folder, .gguf file, catalog or packaged name, hub id; None = the embedded model
    draft_model: str | None = None  # a small model with the same tokenizer that drafts for `model`
    device: str | None = None  # None or "auto": CUDA when available, else the CPU
    dtype: str | None = None  # None: the device's default; "auto" measures on a CPU
    backend: BackendSpec = BackendSpec()
    workspace: str = ""  # the workspace root: a remote backend's session id (one replica per user) comes from it
    # what runs the model in process: "torch" (transformers), "llamacpp" (a GGUF file on llama.cpp's
    # kernels), or "auto" (llama.cpp for a GGUF file on a CPU where it is installed: runtime/choice.py)
    runtime: str = "auto"


@dataclass(frozen=True)
class EngineInfo:
    """What a running engine is, typed (status() is the figures for people)."""

    name: str  # the model's name or the server's URL
    device: str  # "cpu", "cuda:0", ... or "remote"
    dtype: str  # "float32", "int8", ... or "remote"
    has_fim: bool  # its prompts carry fill-in-the-middle tokens: the text after the cursor is worth sending
    cpu: dict | None = None  # the CPU it runs on (hardware.cpu_info), None on a GPU or elsewhere


@runtime_checkable
class Engine(Protocol):
    def info(self) -> EngineInfo:
        """What this engine is: name, device, dtype, whether it fills in the middle."""

    def count_tokens(self, text: str) -> int:
        """How many model tokens `text` is (the context packer budgets in these)."""

    def stream(self, request: CompletionRequest) -> Stream:
        """Generate the completion at the request's cursor, piece by piece; stops early when
        `request.cancel` is set."""

    def status(self) -> dict:
        """What the status request shows: model, device, dtype, cache and decoding figures."""

    def prefill(self, request: CompletionRequest) -> int | None:
        """Compute the request's prompt ahead of time (an edit just landed; the completion request
        follows), so that a stream of the same or an extended prompt starts warm. Stops early,
        keeping what it computed, when `request.cancel` is set; returns the prompt tokens it
        computed. Engines without a cache do nothing."""

    def refresh(self, cancel) -> int | None:
        """The user paused: compute again exactly what the last prompts reused approximately
        (cells moved into place), so that it never piles up. Stops when `cancel` is set; returns
        the tokens computed. Engines that reuse nothing approximately do nothing."""

    def configure(self, settings: EngineSettings) -> None:
        """Apply settings that change without reloading the model."""

    def close(self) -> None:
        """Free the model and its caches; the engine is not used again."""
