"""The in-process engine: a runtime (the model's forward and its cache: torch or llama.cpp), the
tokenizer, and the speculator."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING


from ..decoding.speculate import Speculator, greedy_tokens
from ..drafts import build_drafters
from ..loading.hardware import cpu_info
from ..loading.memory import HeapTrimmer
from ..protocol import (Completion, CompletionRequest, EngineError, EngineInfo, EngineSettings, StopRule, Stream,
                        valid_text)
from ..runtime import Interrupted, greedy
from ..runtime.llamacpp_prompt import RECOMPUTE
from ..text.fim import PLAIN, FimTemplate, Prompt, detect_template, end_token_ids, read_model_options, render
from ..text.healing import TokenBytes, back_up, last_word_chars
from ..text.stops import StreamState, stream_text
from .measures import Measures
from .token_streams import ConfidentTokens, TimedIterator

if TYPE_CHECKING:  # torch is imported where a torch model runs: an engine on llama.cpp never loads it
    import torch

log = logging.getLogger(__name__)


class CpuDevice(str):
    """The device of an engine whose forward runs in llama.cpp: what is read of a torch.device
    (`.type`, "cpu" as text), without importing torch; torch itself takes it as the string "cpu"
    (a trainer's tensors for this engine)."""

    def __new__(cls) -> CpuDevice:
        return super().__new__(cls, "cpu")

    @property
    def type(self) -> str:
        return "cpu"


def _torch_runtime(model):
    """transformers is imported here, not by the module: a llama.cpp engine never loads it. On a
    GPU, the static cache and its CUDA graphs (static_cache.py) where the model runs there."""
    from ..decoding import kv
    from ..runtime import static_cache
    from ..runtime.torch_runtime import TorchRuntime

    mode = static_cache.mode_for(model)
    if mode is not None:
        return static_cache.StaticRuntime(model, graphs=mode)
    return TorchRuntime(model, kv.PromptCache(kv.PrefixTree()))


class LocalEngine(Measures):
    """Implements the Engine protocol in this process; `generate` and `complete` are the Python API."""

    # Below this many new tokens a verification pass cannot pay for itself.
    MIN_SPECULATIVE_TOKENS = 3

    def __init__(self, model, tokenizer, device: torch.device | CpuDevice, name: str, model_dir: str | None = None,
                 drafters: list | None = None, dtype_choice: dict | None = None, runtime=None,
                 runtime_choice: dict | None = None):
        # the transformers model (None where the forward runs in llama.cpp: runtime/llamacpp.py)
        self.model = model.eval() if model is not None else None
        self.runtime = runtime if runtime is not None else _torch_runtime(model)
        self.runtime_choice = runtime_choice  # which runtime, and why (runtime/choice.py)
        self.dtype_choice = dtype_choice  # how dtype "auto" was decided on this CPU (auto_dtype.py)
        self.tokenizer = tokenizer
        self.device = device
        self.name = name
        self.model_dir = model_dir  # the local folder it came from (None for a hub id)
        self.vocab: dict[str, int] = tokenizer.get_vocab()
        self.fim: FimTemplate = detect_template(self.vocab)
        self.fim_order = read_model_options(model_dir).get("fim_order", "psm") if self.fim.has_fim else "psm"
        self.eos_ids = self._eos_ids()
        self.end_ids = self.eos_ids | end_token_ids(self.fim, self.vocab) | end_token_ids(PLAIN, self.vocab)
        self._token_bytes: TokenBytes | None = None  # built on the first healed prompt
        # what a warm-up leaves, the bound of earlier prompts' KV, the figures: the runtime's cache
        self.prompt_cache = self.runtime.cache
        # Sliding-window caches drop old positions: no cropping, so no reuse and no tree verification.
        self.prompt_cache.reuse = self.runtime.can_crop()
        # Speculation only where a verification pass gives a plain step's logits: llamafile's kernels
        # sum one row apart from a batch on some CPUs (AVX2; status: lossless false), so speculative
        # tokens could leave plain decoding's near a tie. There it decodes plainly: on a CPU drafts
        # barely paid anyway (a node costs 74% of a token, Qwen2.5-Coder-0.5B, 2 cores).
        self.can_speculate = self.prompt_cache.reuse and getattr(self.runtime, "lossless", True)
        # the sources found for the model, and any given (a draft model the user chose)
        self.speculator = Speculator(build_drafters(model, Path(model_dir) if model_dir else None) + list(drafters or []),
                                     max_rows=getattr(self.runtime, "exact_rows", None))
        self.settings = EngineSettings()
        self.closed = False
        self._lock = threading.Lock()  # one model, one decoding loop at a time
        self.heap = HeapTrimmer()  # freed memory back to the system, off the request path
        self.latencies_ms: deque[float] = deque(maxlen=200)
        self.requests = 0
        self.prefilled_tokens = 0  # computed ahead of requests, by prefill()

    def warm_up(self) -> None:
        """One token through the model, so that what happens on a first forward (the lean decoder
        built, int8 weights packed, kernels compiled) is not the first request's to wait for:
        SmolLM2 in int8, first 256-token prefill in a process 1,048 ms, later ones ~200 ms."""
        token = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else min(self.eos_ids or {0})
        self.runtime.warm_up(token)
        self.token_bytes  # token healing's alphabet (Qwen2.5-Coder: 0.3 s), not the first request's wait

    @property
    def dtype(self) -> torch.dtype | None:
        return next(self.model.parameters()).dtype if self.model is not None else None

    def dtype_name(self) -> str:
        """float32, int8, bfloat16, ...; a GGUF file's own weight type on llama.cpp (Q4_K_M, ...)."""
        if self.model is None:
            return self.runtime.weights_type
        from ..loading.int8 import is_int8

        return "int8" if is_int8(self.model) else str(self.dtype).removeprefix("torch.")

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        config = getattr(self.model, "generation_config", None)
        for source in (getattr(config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return ids

    # --- tokens ---------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(valid_text(text), add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    @property
    def token_bytes(self) -> TokenBytes:
        if self._token_bytes is None:
            self._token_bytes = TokenBytes.of(self.tokenizer)
        return self._token_bytes

    def prompt(self, prefix: str, suffix: str = "", *, heal: bool = True, fim: bool = True) -> Prompt:
        """The prompt for a cursor between `prefix` and `suffix`: the model's FIM template (unless
        `fim` is False or it has none), backed up to a token boundary when `heal`."""
        key = (prefix, suffix, heal, fim)
        if (rendered := self.prompt_cache.rendered(key)) is not None:  # the warm-up rendered it already
            return Prompt(list(rendered.ids), rendered.healed)  # a copy: callers may extend it
        bos = self.tokenizer.bos_token_id if getattr(self.tokenizer, "add_bos_token", False) else None
        heal_fn = (lambda text, ids: back_up(ids, self.token_bytes, last_word_chars(self.tokenizer, text))) \
            if heal else None
        prompt = render(self.fim if fim else PLAIN, self.encode, self.vocab, prefix, suffix, bos_id=bos,
                        order=self.fim_order, heal=heal_fn)
        if not prompt.ids:  # an empty file with a plain-prefix model: start from a document boundary
            start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else min(self.eos_ids)
            prompt = Prompt([start], prompt.healed)
        self.prompt_cache.remember_rendered(key, prompt)
        return prompt

    def prompt_ids(self, prefix: str, suffix: str = "") -> list[int]:
        """The prompt's ids, ending exactly at the cursor (no healing)."""
        return self.prompt(prefix, suffix, heal=False).ids

    # --- settings and caches --------------------------------------------------------------------

    def configure(self, settings: EngineSettings) -> None:
        changed = settings.exact_prompt != self.settings.exact_prompt
        self.settings = settings
        self.prompt_cache.set_max_bytes(settings.kv_cache_bytes)
        if changed and hasattr(self.runtime, "recompute"):
            with self._lock:
                self.runtime.recompute = None if settings.exact_prompt else RECOMPUTE
                if settings.exact_prompt:
                    self.runtime.make_exact()

    def reset_caches(self) -> None:
        """Forget every cached prompt and draft (for cold-start measurements)."""
        self.prompt_cache.forget_all()
        self.speculator.reset()

    @contextlib.contextmanager
    def _clear_cache_on_error(self):
        """A forward pass that fails half way (out of memory, say) leaves the cache out of step with
        its token list: forget it rather than reuse it."""
        try:
            yield
        except BaseException:
            self.prompt_cache.clear()
            raise

    # --- decoding -------------------------------------------------------------------------------

    def _tokens(self, input_ids: list[int], max_new_tokens: int, end_ids: set[int], cancel,
                speculative: bool, start: tuple[torch.Tensor, torch.Tensor] | None = None,
                confidences: list[float] | None = None) -> Iterator[int]:
        if speculative and self.can_speculate and max_new_tokens >= self.MIN_SPECULATIVE_TOKENS:
            return self.runtime.steps(self.speculator.tokens(self.runtime, input_ids, max_new_tokens, end_ids, cancel,
                                                             start, confidences))
        return self.runtime.steps(greedy_tokens(self.runtime, input_ids, max_new_tokens, end_ids, cancel, start,
                                                confidences))

    def _healed_tokens(self, prompt: Prompt, max_new_tokens: int, end_ids: set[int], cancel,
                       speculative: bool, confidences: list[float] | None = None) -> Iterator[int]:
        """Greedy tokens among those that spell the healed text (see healing.py), one plain step
        each, until it is spelled; then the usual loop, from the prompt and those tokens."""
        rest = prompt.healed.encode()
        ids = list(prompt.ids)
        hidden, logits = self.runtime.prefill_hidden(ids, cancel)
        while rest and len(ids) - len(prompt.ids) < max_new_tokens:
            if cancel is not None and cancel.is_set():
                return
            allowed = self.token_bytes.allowed(rest)
            token = allowed[greedy(logits[allowed])]  # the greedy choice among those that spell it
            ids.append(token)
            if confidences is not None:
                confidences.append(1.0)  # what the user typed: never in doubt
            yield token
            rest = self.token_bytes.rest_after(rest, token)
            hidden, logits = self.runtime.append(token)
        left = max_new_tokens - (len(ids) - len(prompt.ids))
        if left > 0:  # the cache holds the prompt and the healing tokens: go on from there
            yield from self._tokens(ids, left, end_ids, cancel, speculative, start=(hidden, logits),
                                    confidences=confidences)

    def generate(self, input_ids: list[int], max_new_tokens: int, *, speculative: bool = True) -> list[int]:
        """Greedy decoding: the new tokens, ending at EOS (included) or at the limit. The same tokens
        with speculative=True and False; only the time differs."""
        if not input_ids:
            raise ValueError("input_ids is empty: give at least one prompt token")
        with self._lock, self._clear_cache_on_error():
            if self.model is None:
                # llama.cpp's kernels sum a prompt token differently by the batch it came in with (a
                # prefill's, or alone after a cached prefix): from a fresh cache, the same ids give
                # the same tokens whatever ran before
                self.prompt_cache.clear()
            return list(self._tokens(list(input_ids), max_new_tokens, self.eos_ids, None, speculative))

    def stream(self, request: CompletionRequest) -> Stream:
        if self.closed:
            raise EngineError("the engine was closed (the server is shutting down); start it again")
        return Stream(self._stream(request))

    def _stream(self, request: CompletionRequest) -> Generator[str, None, Completion]:
        start = time.perf_counter()
        with self._lock, self._clear_cache_on_error():
            if request.options.cold:
                self.reset_caches()
            prompt = self.prompt(request.prefix, request.suffix, heal=request.options.heal, fim=request.options.fim)
            ids = prompt.ids
            rendered = time.perf_counter()
            state = StreamState(started=start)
            reused_before = self.prompt_cache.reused_tokens
            self.prompt_cache.last_lookup_ms = self.prompt_cache.last_prefill_ms = 0.0
            self.speculator.last_steps = []
            first_ms = None
            confidences = [] if request.stop.min_confidence > 0 else None
            if prompt.healed:
                tokens = self.runtime.steps(self._healed_tokens(prompt, request.max_new_tokens, self.end_ids,
                                                                request.cancel, self.settings.speculative, confidences))
            else:
                tokens = self._tokens(ids, request.max_new_tokens, self.end_ids, request.cancel,
                                      self.settings.speculative, confidences=confidences)
            confident = None
            if confidences is not None:
                tokens = confident = ConfidentTokens(tokens, confidences, request.stop.min_confidence)
            cut = len(prompt.healed)  # the tokens spell the healed text first: the suggestion starts after it

            def after_cursor(generated: list[int]) -> str:
                return self.decode(generated)[cut:]

            tokens = TimedIterator(tokens)
            try:
                for piece in stream_text(tokens, after_cursor, request.stop, self.end_ids, state):
                    if first_ms is None:
                        first_ms = (time.perf_counter() - start) * 1000
                    yield piece
            except Interrupted:  # cancelled during its prefill: the cache keeps what was computed
                state.stop_reason = "cancelled"
            streamed = time.perf_counter()
            if confident is not None and confident.unsure:
                state.stop_reason = "unsure"
            # Across requests: the next keystroke often types the start of this suggestion.
            self.speculator.finish(ids[-32:] + self.encode(prompt.healed + state.text))
            self.prompt_cache.remember()
            self.heap.touch()
        end = time.perf_counter()
        latency = (end - start) * 1000
        lookup, prefill = self.prompt_cache.last_lookup_ms, self.prompt_cache.last_prefill_ms
        stages = {"render": (rendered - start) * 1000, "kv_lookup": lookup, "prefill": prefill,
                  "decode": tokens.ms - lookup - prefill,
                  "stop_rule": (streamed - rendered) * 1000 - tokens.ms, "finish": (end - streamed) * 1000}
        if request.cancel.is_set():
            state.stop_reason = "cancelled"
        else:
            self.latencies_ms.append(latency)
        self.requests += 1
        log.debug("%s completion: %d prompt tokens (%d cached), %d new, %.1f ms, stop %s", request.language or "?",
                  len(ids), self.prompt_cache.reused_tokens - reused_before, state.tokens, latency,
                  state.stop_reason)
        return Completion(state.text, state.tokens, len(ids), latency, first_ms if first_ms is not None else latency,
                          state.stop_reason, self.prompt_cache.reused_tokens - reused_before,
                          {k: round(v, 3) for k, v in stages.items()}, list(self.speculator.last_steps))

    # Long enough to run at full speed, short enough that a request waits at most one chunk (~0.2 s
    # for a 135M model on one CPU core) when it cancels the warm-up it follows.
    PREFILL_CHUNK = 64

    def prefill(self, request: CompletionRequest) -> int:
        if self.closed:
            return 0
        prompt = self.prompt(request.prefix, request.suffix, heal=request.options.heal, fim=request.options.fim)
        computed = 0
        with self._lock, self._clear_cache_on_error():
            if not request.cancel.is_set():
                computed = self.runtime.warm(prompt.ids, request.cancel, self.PREFILL_CHUNK)
                self.prefilled_tokens += computed
                self.heap.touch()
        return computed

    def refresh(self, cancel) -> int:
        """The cells the last prompts moved into place (runtime/llamacpp_prompt.py) computed again
        exactly, while the user pauses; stops when `cancel` is set (the next key). Returns the tokens
        computed."""
        if self.closed or not hasattr(self.runtime, "refresh"):
            return 0
        with self._lock, self._clear_cache_on_error():
            return 0 if cancel.is_set() else self.runtime.refresh(cancel)

    def complete(self, prefix: str, suffix: str = "", *, max_new_tokens: int = 64, single_line: bool = False,
                 language: str = "", stop: StopRule | None = None) -> Completion:
        """The completion at a cursor between `prefix` and `suffix`, with its latency."""
        if stop is None:
            line_rest = suffix.split("\n", 1)[0]
            stop = StopRule(single_line=single_line, suffix_line=line_rest)
        return self.stream(CompletionRequest(prefix, suffix, language, max_new_tokens, stop)).result()

    # --- status ---------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        return EngineInfo(self.name, str(self.device), self.dtype_name(), self.fim.has_fim,
                          self._cpu())

    def _cpu(self) -> dict | None:
        if self.device.type != "cpu":
            return None
        return cpu_info(self.runtime.threads if self.model is None else None).to_json()

    def status(self) -> dict:
        if self.closed:
            return {"model": self.name, "device": str(self.device), "closed": True}
        lat = sorted(self.latencies_ms)
        return {
            "model": self.name,
            "device": str(self.device),
            "dtype": self.dtype_name(),
            "dtype_choice": self.dtype_choice,
            "runtime": self.runtime.name,
            "runtime_choice": self.runtime_choice,
            "cpu": self._cpu(),
            "fim_template": self.fim.name,
            "fim_order": self.fim_order,
            "parameters": self.runtime.parameters(),
            "requests": self.requests,
            "latency_ms": {
                "last": round(self.latencies_ms[-1], 2) if lat else None,
                "p50": round(lat[len(lat) // 2], 2) if lat else None,
                "p95": round(lat[min(len(lat) - 1, int(len(lat) * 0.95))], 2) if lat else None,
            },
            "speculative": {"enabled": self.settings.speculative and self.can_speculate,
                            "off_because": self._speculation_off(),
                            "heads": self.speculator.drafter("heads") is not None, **self.speculator.to_json()},
            "cache": {**self.prompt_cache.to_json(), "prefilled_ahead": self.prefilled_tokens},
            "moved_cells": self._moved_cells(),
        }

    def _moved_cells(self) -> dict:
        """Whether a keystroke reuses the cells of text that only moved, and the figures."""
        if not hasattr(self.runtime, "moves_json"):
            return {"on": False, "why": f"the {self.runtime.name} runtime computes every prompt token after the "
                                        "common prefix: cells are moved on llama.cpp (a GGUF model) only"}
        moves = self.runtime.moves_json()
        return {"on": moves["recompute"] is not None, **moves,
                **({"why": "exact_prompt = true"} if moves["recompute"] is None else {})}

    def _speculation_off(self) -> str | None:
        if not self.settings.speculative:
            return "speculative = false"
        if not self.prompt_cache.reuse:
            return "the model's cache drops old positions (sliding window): no tree to verify"
        if not self.can_speculate:
            return ("llama.cpp sums one row apart from a batch here (llamafile's kernels): plain decoding keeps "
                    "the tokens exact; to speculate, reinstall llama-cpp-python: CMAKE_ARGS=\"-DGGML_LLAMAFILE=OFF\" "
                    "pip install --no-cache-dir --force-reinstall --no-deps llama-cpp-python==0.3.36 (slower prompts)")
        return None

    def close(self) -> None:
        """Drop the caches and the model's weights; what is left can be garbage-collected."""
        with self._lock:
            self.closed = True
            self.heap.close()
            self.prompt_cache.forget_all()
            self.speculator.reset()
            self.speculator.drafters = []  # a draft model's weights go with them
            self.model = None
            if hasattr(self.runtime, "close"):  # llama.cpp's model and context are freed here, not collected
                self.runtime.close()
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()

