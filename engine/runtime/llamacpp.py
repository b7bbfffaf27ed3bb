"""The llama.cpp runtime: the target's forward on llama.cpp's kernels, in process, through
llama-cpp-python's low-level API, on a GGUF file as it is (no float32 copy, no torch, no
transformers on a keystroke).

One context, one unified KV cache. Sequence 0 holds the prompt and what was accepted. A draft tree
goes in one `llama_decode`: each branch (root to leaf) is a sequence of its own, a node shared by
several branches carries each of their ids, and every node asks for its logits. The accepted path
is then copied into sequence 0 and the branches removed (`llama_memory_seq_cp/rm`).

The final hidden state (embeddings on, pooling none) comes beside the logits only for a runtime
made with `hidden=True` (draft heads read it): with embeddings on, llama.cpp computes every token's
output, a prompt's included (Qwen2.5-Coder's 151,936 logits for each of a prompt's tokens).

Exactness. Flash attention is off: its one-token and batched kernels disagree once a few hundred
cells are cached. The other kernels sum a row differently by batch size, in classes (measured here, row
by row against each other): Qwen2.5-Coder-0.5B Q4_K_M gives the same logits, bit for bit, for 1 to 7
rows and again among 8 rows and more, 0.27-0.34 apart between the two; the embedded model exported
in float32 gives one result for 1 row and another for every batch of 2 to 16 (6.6e-5 apart); with
the repacked "extra buffer" weights on, Qwen's rows differed already at 4 (0.31). So: extra buffers
off, and at load (llamacpp_kernels.py, past 256 cached tokens, where kernels change) the sizes
that agree with each other are found. Plain decoding (`append`) and every verification pass then
run in one class: one row and trees of up to the class's largest size where one row shares its
kernels with small batches; else every decode padded to two rows at least (a second row in a
scratch sequence, dropped after) and trees of up to the batch class's largest size, where padding
is cheap (the embedded model: 2.7 against 2.9 ms). Where a padded step costs nearly a second token
(Qwen2.5-Coder-0.5B on 2 AVX2 cores: 54 against 31 ms), plain decoding keeps one row and the engine
says `lossless: false`: a verification pass's logits could then differ from a plain step's near a
tie, so the engine does not speculate (engines/local.py). A tree's every row asks
for its logits, so the output layer runs in the same class too. The cells a pass fills also matter
(attention sums over cells in their order): the tree's first chain goes first in the batch, so a path
along it lies in order and the next token fills the cell right after it; a path that leaves it is
decoded again in order (`commit`), as plain decoding would have laid it.
"""

from __future__ import annotations

import ctypes
import logging
import time
from pathlib import Path

import numpy as np

from ..decoding.verify import DraftTree, first_chain
from ..protocol import EngineError, ModelLoadError
from . import Interrupted, OnePromptCache, Verified, llamacpp_stop
from .llamacpp_prompt import MAX_MOVES, PromptCells
from .llamacpp_stop import DecodeStop

log = logging.getLogger(__name__)

BATCH = 512  # tokens a decode takes at most (a prefill goes in chunks of this)
# ... and a prefill that may be stopped: a stopped decode's cells are dropped, so a prompt that is
# stopped again and again (a key every 120 ms, a cold prompt of 5 s) keeps whole chunks to get on.
# Only a prompt's last chunk stops part way; the others end first, since the next key's prompt holds
# their tokens too, in place or moved (the typed tokens: stopped at once, keys every 120 ms saved 25%
# of characters instead of 32%): a stop waits at most one chunk (Qwen2.5-Coder-0.5B, 2-core EPYC:
# 32 rows 194 ms, 64 rows 350 ms).
CANCELLABLE_CHUNK = 32
MAX_BRANCHES = 16  # sequences a tree may use besides sequence 0
PAD_SEQ = MAX_BRANCHES + 1  # the scratch sequence of a padding row
PARK_SEQ = PAD_SEQ + 1  # the first of the sequences moved runs wait in (llamacpp_prompt.py)
REFRESH_SEQ = PARK_SEQ + MAX_MOVES  # where stale cells are computed again


class LlamaCppUnavailable(RuntimeError):
    """llama-cpp-python cannot be imported here (not built, no compiler, another OS)."""


def import_llama_cpp():
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:  # OSError: the shared library failed to load
        raise LlamaCppUnavailable(f"llama-cpp-python is not available ({exc})") from exc
    import llama_cpp._logger  # noqa: F401 - installs its own log callback on import: ours replaces it

    llama_cpp.llama_log_set(_log_callback(llama_cpp), ctypes.c_void_p(0))
    return llama_cpp


def build_flags(L) -> str:
    """What this llama.cpp was built with (its CPU features, LLAMAFILE or not): part of what the
    kernel classes and the runtimes' speeds depend on."""
    info = L.llama_print_system_info()
    return " ".join((info.decode() if isinstance(info, bytes) else str(info)).split())


_LOG_CALLBACK = None  # the ctypes callback must outlive every call llama.cpp makes to it
GGML_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml's enum: 1 debug, 2 info, 3 warn, 4 error, 5 cont


def _log_callback(llama_cpp):
    """llama.cpp's warnings and errors to this module's logger; its info lines (a model load prints a
    hundred) dropped. llama-cpp-python's own callback maps an older enum and prints info lines."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        @llama_cpp.llama_log_callback
        def callback(level, text, user_data):
            level = GGML_LOG_LEVELS.get(level)
            if level is not None and llamacpp_stop.stopping:  # llama.cpp reports a decode we stopped as failed
                level = logging.DEBUG
            if level is not None and log.isEnabledFor(level):
                log.log(level, "llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

        _LOG_CALLBACK = callback
    return _LOG_CALLBACK


_backend_ready = False


class LlamaCppRuntime(PromptCells, OnePromptCache):
    name = "llamacpp"

    def __init__(self, path: Path, threads: int, n_ctx: int = 4096, hidden: bool = False):
        global _backend_ready
        L = import_llama_cpp()
        self.L = L
        if not _backend_ready:
            L.llama_backend_init()
            _backend_ready = True
        params = L.llama_model_default_params()
        params.use_extra_bufts = False  # repacked weights sum a row differently by batch (see above)
        self.path = Path(path)
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelLoadError(f"GGUF file {str(path)!r} could not be loaded by llama.cpp; is it a model llama.cpp "
                                 "runs? Set `model` to another file, or runtime = \"torch\"")
        ctx_params = L.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = ctx_params.n_ubatch = BATCH
        ctx_params.n_seq_max = REFRESH_SEQ + 1
        ctx_params.kv_unified = True  # branches share the prompt's cells
        ctx_params.embeddings = hidden  # the final hidden state beside the logits
        if hidden:  # else the model's own (unspecified), which llama.cpp warns about overriding
            ctx_params.pooling_type = L.LLAMA_POOLING_TYPE_NONE
        self.with_hidden = self._embeddings_on = hidden
        ctx_params.n_threads = ctx_params.n_threads_batch = threads
        # Flash attention's one-token and batched kernels sum differently once the cache passes a few
        # hundred cells (Qwen2.5-Coder-0.5B at 259 cached tokens: 0.25 in a logit between a 2-row chain
        # and a 1-row step, which the kernel probe at 64 tokens did not see); without it, 0.
        ctx_params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise ModelLoadError(f"llama.cpp could not make a context for {str(path)!r} ({n_ctx} tokens)")
        self.threads = threads
        self.n_ctx = n_ctx
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_embd = L.llama_model_n_embd(self.model)
        self.memory = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(BATCH, 0, REFRESH_SEQ + 1)
        self.weights_type = _weights_type(L, self.model)
        self.cache = self  # what the engine asks a prompt cache (rendered prompts, figures) is asked here
        self.reuse = True
        self.tokens: list[int] = []  # what sequence 0 holds, position by position
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.last_lookup_ms = 0.0
        self.last_prefill_ms = 0.0
        self.prefill_threads = None
        # measured at load (llamacpp_kernels.py): the widest exact tree, and the fewest rows a decode runs
        self.exact_rows = 1
        self.min_rows = 1
        self.lossless = True  # whether plain steps and verification passes share a kernel class
        self.padding_cost: float | None = None
        self.max_branches = 1  # chains only: see llamacpp_kernels.measure_kernel_classes
        self.kernel_classes: list[list[int]] = []
        self.class_differences: dict[str, float] = {}
        self.known_pass_ms: dict[int, float] = {}  # llamacpp_kernels.measure_pass_costs(): ms by rows, kept per machine
        self._ready: tuple[list[int], np.ndarray, np.ndarray] | None = None  # a warm-up's whole prompt
        self._last_row = 0  # the last decode's last real row (padding rows come after it)
        self._setup_prompt(PARK_SEQ, REFRESH_SEQ, 2 * MAX_BRANCHES)
        self.closed = False
        self.stop = DecodeStop(L, self.ctx)  # a prefill stops part way when its request is cancelled

    # --- the batch ------------------------------------------------------------------------------

    def _decode(self, items: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """One llama_decode of (token, position, sequence ids, wants output) items."""
        batch, L = self.batch, self.L
        batch.n_tokens = len(items)
        for i, (token, position, seqs, output) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = len(seqs)
            for j, seq in enumerate(seqs):
                batch.seq_id[i][j] = seq
            batch.logits[i] = output
        code = L.llama_decode(self.ctx, batch)
        if code == 0:
            self.shift_pending = False  # llama.cpp applied moved cells' position shifts before the batch
        if code == 2 and self.stop.raised:
            raise Interrupted("the prefill was stopped: its request was cancelled")
        if code != 0:
            raise EngineError(f"llama_decode failed (code {code}: {'no room in the KV cache' if code == 1 else 'error'}) "
                              f"at {len(self.tokens)} cached tokens")

    def _logits(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()

    def _hidden(self, i: int) -> np.ndarray:
        if not self.with_hidden:
            return np.empty(0, dtype=np.float32)
        return np.ctypeslib.as_array(self.L.llama_get_embeddings_ith(self.ctx, i), shape=(self.n_embd,)).copy()

    def _stoppable(self, cancel):
        """`cancel` for a decode that may stop part way; None (it runs to the end) while moved cells'
        shifts wait: llama.cpp rotates their keys at the start of the next decode, in place, layer by
        layer, and one stopped there is rotated again in full by the one after."""
        return None if self.shift_pending else cancel

    def _crop(self, length: int) -> None:
        """Sequence 0 back to its first `length` positions (the other sequences as they are)."""
        length = max(0, length)
        self.L.llama_memory_seq_rm(self.memory, 0, length, -1)
        self.tokens = self.tokens[:length]
        if self.stale_from is not None and self.stale_from >= length:
            self.stale_from, self.drift = None, 0

    def _run(self, ids: list[int], start: int, last_output: bool = True, cancel=None, redone: bool = False) -> int:
        """`ids` decoded into sequence 0 from position `start`, BATCH at a time; the last asks for
        its output. Returns where it stopped (a stop ends the chunks, CANCELLABLE_CHUNK each, at the
        next one; only the prompt's last, the one with `last_output`, stops part way, and with
        `redone`, one whose tokens the next key computes again for the most part, in the first half
        of its decode: past it, what is done is worth more than what is left). With hidden
        states on, llama.cpp outputs every token of a decode, so the prompt goes in without them
        and its last token alone with them (Qwen2.5-Coder-0.5B, 209 tokens: 1.5 s against 2.1)."""
        if self.with_hidden and last_output and len(ids) > 1:
            position = self._run(ids[:-1], start, last_output=False, cancel=cancel, redone=redone)
            return self._run(ids[-1:], position, cancel=cancel) if position == start + len(ids) - 1 else position
        self._embeddings(self.with_hidden and last_output)
        position = start
        try:
            step = BATCH if cancel is None else CANCELLABLE_CHUNK
            while position < start + len(ids):
                if cancel is not None and cancel.is_set():
                    break
                chunk = ids[position - start:position - start + step]
                end = position + len(chunk)
                last = end == start + len(ids)
                with self.stop.watching(self._stoppable(cancel) if last and (last_output or redone) else None,
                                        None if last_output else self._half_pass_s(len(chunk))):
                    self._decode_padded([(t, position + k, (0,), last_output and position + k == start + len(ids) - 1)
                                         for k, t in enumerate(chunk)])
                self.tokens = self.tokens + chunk
                position = end
        except Interrupted:  # the chunk's cells are gone (llama.cpp removes an aborted batch's): keep what is there
            kept = self.L.llama_memory_seq_pos_max(self.memory, 0) + 1
            self._crop(max(0, min(kept, len(self.tokens))))
            position = len(self.tokens)
        finally:
            self._embeddings(self.with_hidden)
        return position

    def _embeddings(self, on: bool) -> None:
        if on != self._embeddings_on:
            self.L.llama_set_embeddings(self.ctx, on)
            self._embeddings_on = on

    # --- the prompt (llamacpp_prompt.py brings sequence 0 to one) ------------------------------

    def continuation_logits(self, prompt: list[int], target: list[int], exact: bool = True) -> np.ndarray:
        """The logits that score `target` written after `prompt` (row k predicts target[k]): with the
        prompt computed exactly, or (`exact=False`) as a keystroke would bring the cache to it, moved
        cells and all. The prompt's cells stay for the next prompt that shares its head; the
        target's are removed."""
        kept = self.recompute
        if exact:  # nothing stale kept, nothing moved
            self.make_exact()
            self.recompute = None
        try:
            _, first = self.prefill_hidden(prompt)
        finally:
            self.recompute = kept
        past, rows = len(self.tokens), [first]
        for start in range(0, len(target) - 1, BATCH):
            chunk = target[start:start + BATCH][:len(target) - 1 - start]
            self._decode_padded([(t, past + start + k, (0,), True) for k, t in enumerate(chunk)])
            rows.extend(self._logits(k) for k in range(len(chunk)))
        self.L.llama_memory_seq_rm(self.memory, 0, past, -1)
        return np.stack(rows)

    def append(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        self._decode_padded([(token, len(self.tokens), (0,), True)])
        self.tokens = self.tokens + [token]
        return self._hidden(0), self._logits(0)

    def _decode_padded(self, items: list) -> None:
        """A decode of at least `min_rows` rows: padding rows (the last token again, in the scratch
        sequence, its output asked too) are dropped after."""
        self._last_row = len(items) - 1  # the last real row's index in the batch: padding comes after it
        pad = self.min_rows - len(items)
        if pad > 0:
            token, position = items[-1][0], items[-1][1]
            items = items + [(token, position, (PAD_SEQ,), True)] * pad
        try:
            self._decode(items)
        finally:
            if pad > 0:
                self.L.llama_memory_seq_rm(self.memory, PAD_SEQ, -1, -1)

    def steps(self, tokens):
        return tokens

    def can_crop(self) -> bool:
        return True

    def warm_up(self, token: int) -> None:
        """One token through the model and out again: the first decode builds what llama.cpp builds."""
        self._crop(0)
        self.append(token)
        self._crop(0)

    def every_output(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """`ids` from an empty cache in one decode, every position's output: the hidden states
        (T, H) and greedy next tokens (T,) that draft heads are trained on (a runtime made with
        `hidden=True`). The cache is emptied after."""
        if not self.with_hidden or len(ids) > BATCH:
            raise ValueError("every_output needs hidden=True and at most BATCH tokens")
        self._crop(0)
        self._embeddings(True)
        self._decode([(t, k, (0,), True) for k, t in enumerate(ids)])
        L, n = self.L, len(ids)
        logits = np.ctypeslib.as_array(L.llama_get_logits(self.ctx), shape=(n, self.n_vocab))
        hidden = np.ctypeslib.as_array(L.llama_get_embeddings(self.ctx), shape=(n, self.n_embd)).copy()
        greedy = logits.argmax(axis=1).astype(np.int32)
        L.llama_memory_seq_rm(self.memory, 0, -1, -1)
        return hidden, greedy

    # --- a draft tree ----------------------------------------------------------------------------

    def verify(self, tree: DraftTree, batch_rows: int = 1) -> Verified:
        """One decode after sequence 0, every node asking for its logits. A chain goes straight into
        sequence 0; a tree with branches (only where measured exact: `max_branches`) gives each
        branch a sequence of its own, sharing the prompt's cells, in the tree's order, so the first
        chain takes cells in order."""
        past, n = len(self.tokens), len(tree)
        if all(tree.parents[i] == i - 1 for i in range(n)):
            self._decode_padded([(tree.tokens[i], past + i, (0,), True) for i in range(n)])
            return Verified(tree, np.stack([self._hidden(i) for i in range(n)]), self._logits, past)
        leaves = [i for i in range(n) if not tree.children[i]]
        if len(leaves) > min(self.max_branches, MAX_BRANCHES):
            raise EngineError(f"a tree of {len(leaves)} branches, over the {self.max_branches} this runtime verifies")
        seqs: list[set[int]] = [set() for _ in range(n)]
        for b, leaf in enumerate(leaves, start=1):  # every node on a branch carries the branch's id
            node = leaf
            while node >= 0:
                seqs[node].add(b)
                node = tree.parents[node]
            self.L.llama_memory_seq_cp(self.memory, 0, b, 0, past)  # the prompt's cells are the branch's too
        self._decode_padded([(tree.tokens[i], past + tree.depths[i], tuple(sorted(seqs[i])), True) for i in range(n)])
        return Verified(tree, np.stack([self._hidden(i) for i in range(n)]), self._logits, past,
                        branches={leaf: b for b, leaf in enumerate(leaves, start=1)})

    def commit(self, verified: Verified, path: list[int]) -> None:
        """Sequence 0 keeps the accepted path and drops the rest. A chain's path lies in sequence 0
        already, in order; a branch's is copied in when it runs along the first chain (in order
        too), else decoded again, in order, as plain decoding lays it."""
        tree, past = verified.tree, verified.past
        accepted = [tree.tokens[i] for i in path]
        if not verified.branches:
            self.L.llama_memory_seq_rm(self.memory, 0, past + len(path), -1)
            self.tokens = self.tokens + accepted
            return
        chain = first_chain(tree)
        along = path == chain[:len(path)] and chain == list(range(len(chain)))
        if along:
            leaf = next(leaf for leaf, b in verified.branches.items() if _on_branch(tree, path[-1], leaf))
            self.L.llama_memory_seq_cp(self.memory, verified.branches[leaf], 0, past, past + len(path))
        for b in verified.branches.values():
            self.L.llama_memory_seq_rm(self.memory, b, -1, -1)
        if along:
            self.tokens = self.tokens + accepted
        else:
            self._run(accepted, past, last_output=False)

    # --- what this machine charges -------------------------------------------------------------

    def pass_ms(self, rows: int) -> float:
        """What a verification pass of `rows` nodes costs here: the figure measured at load (kept in
        the cache folder with the kernel classes), else timed now. The sizer's running figures then
        follow the real passes."""
        known = self.known_pass_ms.get(rows)
        return known if known is not None else self._timed_pass(rows)

    def _half_pass_s(self, rows: int) -> float:
        """Half of what a decode of `rows` costs here, by the widest pass measured at load (0: none)."""
        if not self.known_pass_ms:
            return 0.0
        widest = max(self.known_pass_ms)
        return self.known_pass_ms[widest] * rows / widest / 2000

    def _timed_pass(self, rows: int) -> float:
        """A decode of `rows` nodes (a chain of the last token) with logits for each, timed; then
        undone."""
        past = len(self.tokens)
        token = self.tokens[-1] if self.tokens else 0
        started = time.perf_counter()
        self._decode_padded([(token, past + k, (0,), True) for k in range(rows)])
        for k in range(rows):
            self._logits(k)
        ms = (time.perf_counter() - started) * 1000
        self.L.llama_memory_seq_rm(self.memory, 0, past, -1)
        return ms

    def output_batch_rows(self) -> int:
        return 1 << 30  # logits come with the pass: no output layer to run afterwards

    # --- what the engine asks a prompt cache -----------------------------------------------------

    def clear(self) -> None:
        self._ready = None
        if not self.closed:
            self.parked = []
            self.L.llama_memory_clear(self.memory, True)  # every sequence, parked and scratch ones too
            self._crop(0)

    def parameters(self) -> int:
        return int(self.L.llama_model_n_params(self.model))

    def to_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "hit_rate": round(self.reused_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
                "prefix_tree": None, "prefill_threads": None, "n_ctx": self.n_ctx, "threads": self.threads,
                "exact_rows": self.exact_rows, "min_rows": self.min_rows, "kernel_classes": self.kernel_classes,
                "kernel_classes_cached": getattr(self, "kernels_cached", False), "lossless": self.lossless,
                "padding_cost": self.padding_cost,
                "max_branches": self.max_branches, "branches_difference": getattr(self, "branches_difference", None),
                "class_differences": self.class_differences, "moved_cells": self.moves_json(), "pass_ms_at_load": {
                    str(rows): ms for rows, ms in self.known_pass_ms.items()}}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def _on_branch(tree: DraftTree, node: int, leaf: int) -> bool:
    """Whether the branch from the root to `leaf` passes through `node`."""
    while leaf >= 0:
        if leaf == node:
            return True
        leaf = tree.parents[leaf]
    return False


def _weights_type(L, model) -> str:
    buf = ctypes.create_string_buffer(256)
    L.llama_model_desc(model, buf, 256)
    desc = buf.value.decode(errors="replace")  # e.g. "qwen2 1B Q4_K - Medium", "llama ?B all F32"
    name = desc.split(" ", 2)[-1] if desc.count(" ") >= 2 else desc
    # as the files are named: Q4_K_M, F32
    name = name.removeprefix("all ")
    for size, letter in ((" - Small", "_S"), (" - Medium", "_M"), (" - Large", "_L")):
        name = name.replace(size, letter)
    return name
