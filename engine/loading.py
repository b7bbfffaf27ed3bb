"""load_engine: find a model folder (or hub id), load it on the right device, wrap it in an Engine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import torch

from . import decode, kv
from .drafts.heads import DraftHeads, HeadDrafter
from .drafts.lookahead import LookaheadCache
from .drafts.ngram import NgramDrafter, NgramTable, TableDrafter
from .fim import FimTemplate, detect_template, end_token_ids, read_model_options, render_ids
from .request import Completion, CompletionRequest, StopRule
from .threads import PrefillThreads

log = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path(__file__).parent / "models" / "default"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the model and how to fix it."""


def default_model_dir() -> Path:
    return DEFAULT_MODEL_DIR


def pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for but CUDA is not available here; "
                             "set device = \"cpu\" or \"auto\"")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r}: use \"auto\", \"cpu\" or \"cuda\"") from exc


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        # CPU kernels are fastest (and exact) in float32; on a GPU half precision halves the traffic.
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cpu_threads(model) -> int:
    """Threads for CPU decoding. A small model decodes one token in well under a millisecond of math,
    so extra threads only add synchronisation, and when another process holds a core they wait on
    each other (measured here: 0.9 ms/token on 1 thread, 55 ms on 2 with the other core busy).
    MEMOSIGHT_THREADS overrides."""
    if os.environ.get("MEMOSIGHT_THREADS", "").isdigit():
        return max(1, int(os.environ["MEMOSIGHT_THREADS"]))
    params = sum(p.numel() for p in model.parameters())
    return 1 if params < 100_000_000 else max(1, (os.cpu_count() or 2) - 1)


def _resolve(model: str | None) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is a local folder)."""
    if model is None:
        if not (DEFAULT_MODEL_DIR / "config.json").is_file():
            raise ModelLoadError(
                f"the embedded default model is missing from {DEFAULT_MODEL_DIR}; reinstall memosight, "
                "or set model = \"/path/to/a/model/folder\" in .memosight.toml")
        return str(DEFAULT_MODEL_DIR), True
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")) or os.sep + os.sep in model:
        if not path.is_dir():
            raise ModelLoadError(f"model folder {str(path)!r} does not exist; check the `model` setting "
                                 "(a folder with config.json, or a Hugging Face id such as 'org/name')")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {str(path)!r} has no config.json; it must be a folder "
                                 "written by save_pretrained (config, weights and tokenizer)")
        return str(path), True
    return model, False


def _offline(local: bool) -> bool:
    """Whether to stay off the Hugging Face hub: a local folder, or HF_HUB_OFFLINE=1."""
    return local or os.environ.get("HF_HUB_OFFLINE") == "1"


def load_tokenizer(model: str | None = None):
    """Only the tokenizer of a model (the embedded one by default): for tools that count or
    tabulate tokens and need no weights."""
    from transformers import AutoTokenizer

    source, local = _resolve(model)
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=_offline(local))
    except (OSError, ValueError, json.JSONDecodeError, KeyError) as exc:
        raise ModelLoadError(f"the tokenizer of {source!r} could not be loaded ({exc}); point --model at a "
                             "folder written by save_pretrained, or a model in the Hugging Face cache") from exc


def _load_pretrained(source: str, local: bool, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars would land in an editor's log

    offline = _offline(local)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline)
    except (OSError, ValueError, json.JSONDecodeError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if local:
            raise ModelLoadError(f"model folder {source!r} could not be loaded ({first}); it looks "
                                 "incomplete or corrupt: save it again with save_pretrained, or point "
                                 "`model` at another folder") from exc
        raise ModelLoadError(
            f"model {source!r} is not a folder on disk and could not be loaded from the Hugging Face "
            f"cache ({first}). Download it first where there is network (`hf download {source}`), or set "
            "`model` to a local folder") from exc
    return model, tokenizer


class Engine:
    """A loaded model and tokenizer, with the decoding loops and request statistics."""

    def __init__(self, model, tokenizer, device: torch.device, name: str, model_dir: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.name = name
        self.model_dir = model_dir  # the local folder it came from (None for a hub id)
        self.vocab: dict[str, int] = tokenizer.get_vocab()
        self.fim: FimTemplate = detect_template(self.vocab)
        self.fim_order = read_model_options(model_dir).get("fim_order", "psm") if self.fim.has_fim else "psm"
        self.eos_ids = self._eos_ids()
        self.end_ids = self.eos_ids | end_token_ids(self.fim, self.vocab)
        self.prompt_cache = decode.PromptCache(kv.PrefixTree())
        # Sliding-window caches drop old positions: no cropping, so no reuse and no tree verification.
        self.can_speculate = kv.supports_reuse(model)
        self.prompt_cache.reuse = self.can_speculate
        self.speculative = True  # default for stream(); generate() takes it per call
        self.heads = DraftHeads.load(Path(model_dir)) if model_dir else None
        if self.heads is not None:
            self.heads.to(device=device, dtype=self.dtype)
        self.heads_drafter = (HeadDrafter(self.heads, model.get_output_embeddings())
                              if self.heads is not None else None)
        self.lookahead = LookaheadCache()
        self.table = NgramTable.load(Path(model_dir)) if model_dir else None
        self.table_drafter = TableDrafter(self.table) if self.table is not None else None
        self.drafters = [d for d in (NgramDrafter(), self.lookahead, self.table_drafter, self.heads_drafter)
                         if d is not None]
        self.controller = decode.DraftController()
        self.spec_stats = decode.SpecStats()
        self._lock = threading.Lock()  # one model, one decoding loop at a time
        self.latencies_ms: deque[float] = deque(maxlen=200)
        self.requests = 0

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return ids

    # --- tokens ---------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def reset_caches(self) -> None:
        """Forget every cached prompt and draft (for cold-start measurements)."""
        self.prompt_cache.clear()
        if self.prompt_cache.prefix_tree is not None:
            self.prompt_cache.prefix_tree = kv.PrefixTree(self.prompt_cache.prefix_tree.block_tokens,
                                                          self.prompt_cache.prefix_tree.max_bytes)
        self.lookahead.sequences.clear()

    def set_kv_cache_bytes(self, max_bytes: int) -> None:
        """The memory bound of the prefix tree (config: kv_cache_mb)."""
        tree = self.prompt_cache.prefix_tree
        if tree is not None:
            tree.max_bytes = max_bytes
            tree.store([], self.prompt_cache.cache or kv.new_cache(self.model))  # evicts down to the bound

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def prompt_ids(self, prefix: str, suffix: str = "") -> list[int]:
        bos = self.tokenizer.bos_token_id if getattr(self.tokenizer, "add_bos_token", False) else None
        ids = render_ids(self.fim, self.encode, self.vocab, prefix, suffix, bos_id=bos, order=self.fim_order)
        if not ids:  # an empty file with a plain-prefix model: start from a document boundary
            start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else min(self.eos_ids)
            ids = [start]
        return ids

    # --- decoding -------------------------------------------------------------------------------

    def generate(self, input_ids: list[int], max_new_tokens: int, *, speculative: bool = True) -> list[int]:
        """Greedy decoding: the new tokens, ending at EOS (included) or at the limit.

        `speculative` selects the speculative loop once it exists; both return the same tokens.
        """
        if not input_ids:
            raise ValueError("input_ids is empty: give at least one prompt token")
        with self._lock, self._clear_cache_on_error():
            return list(self._tokens(list(input_ids), max_new_tokens, self.eos_ids, None, speculative))

    @contextlib.contextmanager
    def _clear_cache_on_error(self):
        """A forward pass that fails half way (out of memory, say) leaves the cache out of step with
        its token list: forget it rather than reuse it."""
        try:
            yield
        except BaseException:
            self.prompt_cache.clear()
            raise

    # Below this many new tokens a verification pass cannot pay for itself.
    MIN_SPECULATIVE_TOKENS = 3

    def _tokens(self, input_ids: list[int], max_new_tokens: int, end_ids: set[int], cancel,
                speculative: bool) -> Iterator[int]:
        if speculative and self.can_speculate and max_new_tokens >= self.MIN_SPECULATIVE_TOKENS:
            return decode.speculative_tokens(self.model, input_ids, max_new_tokens, end_ids, self.prompt_cache,
                                             self.drafters, self.controller, self.spec_stats, cancel,
                                             self.lookahead, self.heads_drafter)
        return decode.greedy_tokens(self.model, input_ids, max_new_tokens, end_ids, self.prompt_cache, cancel)

    def stream(self, request: CompletionRequest, result: dict | None = None) -> Iterator[str]:
        """Text pieces as tokens are accepted. If `result` is given it receives the Completion."""
        start = time.perf_counter()
        ids = self.prompt_ids(request.prefix, request.suffix)
        state = decode.StreamState(started=start)
        reused_before = self.prompt_cache.reused_tokens
        first_ms = None
        with self._lock, self._clear_cache_on_error():
            tokens = self._tokens(ids, request.max_new_tokens, self.end_ids, request.cancel, self.speculative)
            for piece in decode.stream_text(tokens, self.decode, request.stop, self.end_ids, state):
                if first_ms is None:
                    first_ms = (time.perf_counter() - start) * 1000
                yield piece
            # Across requests: the next keystroke often types the start of this suggestion.
            self.lookahead.remember(ids[-32:] + self.encode(state.text))
            self.prompt_cache.remember()
        latency = (time.perf_counter() - start) * 1000
        if request.cancel.is_set():
            state.stop_reason = "cancelled"
        else:
            self.latencies_ms.append(latency)
        self.requests += 1
        if result is not None:
            result["completion"] = Completion(state.text, state.tokens, len(ids), latency,
                                              first_ms if first_ms is not None else latency, state.stop_reason,
                                              self.prompt_cache.reused_tokens - reused_before)

    def complete(self, prefix: str, suffix: str = "", *, max_new_tokens: int = 64, single_line: bool = False,
                 language: str = "", stop: StopRule | None = None) -> Completion:
        """The completion at a cursor between `prefix` and `suffix`, with its latency."""
        if stop is None:
            line_rest = suffix.split("\n", 1)[0]
            stop = StopRule(single_line=single_line, suffix_line=line_rest)
        request = CompletionRequest(prefix, suffix, language, max_new_tokens, stop)
        result: dict = {}
        for _ in self.stream(request, result):
            pass
        return result["completion"]

    @torch.inference_mode()
    def continuation_loss(self, prefix: str, suffix: str, continuation: str) -> tuple[float, int]:
        """Negative log-likelihood (summed, nats) and token count of `continuation` written at the
        cursor between `prefix` and `suffix`: how well a context predicts the true text, a finer
        measure than exact match when a small model rarely gets a whole line right."""
        prompt, target = self.prompt_ids(prefix, suffix), self.encode(continuation)
        if not target:
            return 0.0, 0
        ids = torch.tensor([prompt + target], device=self.device)
        with self._lock:
            logits = self.model(ids).logits[0, len(prompt) - 1:-1].float()
        loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):], reduction="sum")
        return float(loss), len(target)

    def status(self) -> dict:
        lat = sorted(self.latencies_ms)
        pc = self.prompt_cache
        return {
            "model": self.name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "fim_template": self.fim.name,
            "fim_order": self.fim_order,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "requests": self.requests,
            "latency_ms": {
                "last": round(self.latencies_ms[-1], 2) if lat else None,
                "p50": round(lat[len(lat) // 2], 2) if lat else None,
                "p95": round(lat[min(len(lat) - 1, int(len(lat) * 0.95))], 2) if lat else None,
            },
            "speculative": {"enabled": self.speculative, "heads": self.heads is not None,
                            **self.spec_stats.to_json()},
            "cache": {
                "prompt_tokens": pc.prompt_tokens,
                "reused_tokens": pc.reused_tokens,
                "hit_rate": round(pc.reused_tokens / pc.prompt_tokens, 4) if pc.prompt_tokens else 0.0,
                "prefix_tree": pc.prefix_tree.stats() if pc.prefix_tree is not None else None,
                "prefill_threads": pc.prefill_threads.to_json() if pc.prefill_threads is not None else None,
            },
        }


def load_engine(model: str | None = None, device: str | None = None, dtype: str | None = None) -> Engine:
    torch_device = pick_device(device)
    torch_dtype = pick_dtype(dtype, torch_device)
    source, local = _resolve(model)
    hf_model, tokenizer = _load_pretrained(source, local, torch_dtype)
    hf_model.to(torch_device)
    if torch_device.type == "cpu":
        torch.set_num_threads(cpu_threads(hf_model))
    name = "default" if model is None else model
    log.info("loaded %s on %s (%s)", name, torch_device, torch_dtype)
    engine = Engine(hf_model, tokenizer, torch_device, name, source if local else None)
    if torch_device.type == "cpu" and not os.environ.get("MEMOSIGHT_THREADS"):
        engine.prompt_cache.prefill_threads = PrefillThreads((torch.get_num_threads(), os.cpu_count() or 1))
    return engine
