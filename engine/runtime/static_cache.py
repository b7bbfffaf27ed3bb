"""The GPU runtime: a torch model's forward over a static KV cache, each decoding pass replayed as a
CUDA graph.

On a GPU the dynamic path (torch_runtime.py) launches every small op from Python (~370 for a
6-layer step, ~10 us each) and grows its cache by a row a step, so attention is planned again for
every new length: 29.9 ms a step for a 7.6M-parameter model on an H200, where the arithmetic takes
microseconds. Here:

- One cache tensor, (layers, 2, kv heads, cells, head dim), allocated once for the context
  (`max_len` cells). Cell i holds position i of the one sequence the runtime keeps (the prompt and
  what was accepted, like llama.cpp's sequence 0, llamacpp.py): cropping is a length, and reuse is
  the longest common prefix with the last prompt.
- A pass of n nodes (a plain step is 1) goes in padded to a fixed size (SIZES); each size is one
  `_graph_pass`, captured as a CUDA graph at load and replayed: one host-to-device copy of the
  step's ints (the nodes, their depths and parents, the tree's mask, the cached length), one
  replay, one device-to-host copy of the result (the accepted node and every node's greedy
  token). Inside the graph: the decoder (lean.py's layers, unchanged), attention over every cell
  with a mask built from the cached length and the tree, each node's logits and argmax, and the
  accepted path (`accept_on_device`).
- A prompt's prefill runs eagerly (one pass per chunk; attention over the cells in use), with
  attention kept off cuDNN, whose plans are per length.

On a CPU (the tests; CI has no GPU) the same runtime runs `_graph_pass` eagerly (`graphs="eager"`),
or the exact passes of the dynamic path over the static cells (`graphs="off"`: attention over the
cells in use, the lean decoder's own masks), bit for bit the dynamic path's in float32.
"""

from __future__ import annotations

import contextlib
import os
import time
from os.path import commonprefix

import numpy as np
import torch

from ..decoding.verify import DraftTree, tree_attention_mask
from ..protocol import EngineError
from . import Interrupted, OnePromptCache, Verified
from .lean import LeanDecoder, decoder_for

SIZES = (1, 2, 4, 8, 16, 32, 64)  # the pass sizes captured: a tree of n nodes runs in the next size up
PREFILL_CHUNK = 512  # a prompt's tokens a pass (a cancel is seen between passes)


def mode_for(model) -> str | None:
    """How a torch model runs: the static cache's graphs mode, or None for the dynamic path
    (torch_runtime.py). MEMOSIGHT_STATIC: "auto" (the default: CUDA graphs on a GPU, the dynamic
    path on a CPU, where its prefix tree of earlier prompts pays), "cuda", "eager", "off" (the static
    cells with the dynamic path's passes), "0" (never)."""
    wanted = os.environ.get("MEMOSIGHT_STATIC", "auto")
    if wanted == "0" or why_not(model) is not None:
        return None
    on_gpu = model.get_input_embeddings().weight.device.type == "cuda"
    if wanted == "auto":
        return "cuda" if on_gpu else None
    if wanted not in ("cuda", "eager", "off"):
        raise EngineError(f"MEMOSIGHT_STATIC={wanted!r}: use auto, cuda, eager, off or 0")
    return wanted


def why_not(model) -> str | None:
    """Why `model` cannot run here (None: it can): the lean decoder's layers only, float weights."""
    from ..loading.int8 import is_int8

    if decoder_for(model) is None:
        return f"{type(model).__name__} is not a Llama-family decoder the lean pass runs"
    if is_int8(model):
        return "int8 weights have no GPU kernel here: bfloat16 is faster on a GPU"
    rope = getattr(getattr(model.base_model, "rotary_emb", None), "rope_type", "default")
    if "dynamic" in str(rope):  # it compares a length on the host at every pass: no graph captures that
        return "dynamic RoPE decides its frequencies on the host"
    return None


def accept_on_device(tokens: torch.Tensor, parents: torch.Tensor, visible: torch.Tensor,
                     depths: torch.Tensor, greedy: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The deepest node of the accepted path, found without leaving the device.

    A node holds when its token is its parent's greedy choice (the root always holds); it is on the
    path when every ancestor holds (`visible`: a node's ancestors and itself). Children of one node
    carry different tokens, so the nodes on the path form one chain, and the deepest is unique."""
    holds = (tokens == greedy[parents.clamp(min=0)]) | (parents < 0)
    on_path = ~(visible & ~holds[None, :]).any(dim=1) & real
    return torch.where(on_path, depths, -1).argmax()


class _LayerCells:
    """What the lean decoder's layer i writes its keys and values into: `cells` of the static
    cache; it reads back the first `width` cells (all of them in a graph)."""

    def __init__(self, kv: torch.Tensor, layer: int):
        self.keys, self.values = kv[layer, 0], kv[layer, 1]  # (kv heads, cells, head dim)
        self.cells: torch.Tensor | slice = slice(0, 0)
        self.width = 0

    def update(self, k: torch.Tensor, v: torch.Tensor):
        if isinstance(self.cells, slice):
            self.keys[:, self.cells] = k[0]
            self.values[:, self.cells] = v[0]
        else:  # device indices, inside a graph
            self.keys.index_copy_(1, self.cells, k[0])
            self.values.index_copy_(1, self.cells, v[0])
        return self.keys[None, :, :self.width], self.values[None, :, :self.width]


class _Cells:
    """The static cache as the lean decoder sees a transformers cache (`layers[i].update`)."""

    def __init__(self, kv: torch.Tensor):
        self.layers = [_LayerCells(kv, i) for i in range(kv.shape[0])]
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def at(self, cells, width: int, length: int) -> _Cells:
        for layer in self.layers:
            layer.cells, layer.width = cells, width
        self.length = length
        return self


class _Graph:
    """One pass size: its input and output buffers, and the CUDA graph that replays it (None when
    it runs eagerly)."""

    def __init__(self, size: int, device):
        self.size = size
        # [cached length, real nodes, tokens (n), depths (n), parents (n), visible (n x n)]
        self.ints = torch.zeros(2 + 3 * size + size * size, dtype=torch.long, device=device)
        self.staging = torch.zeros_like(self.ints, device="cpu")
        if self.ints.is_cuda:
            self.staging = self.staging.pin_memory()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.hidden = self.logits = self.result = None  # outputs: (n, H), (n, V), [deepest, greedy (n)]


class StaticRuntime(OnePromptCache):
    name = "torch"
    max_branches = 1 << 30  # a tree of any shape in one pass (the mask says who sees whom)

    def __init__(self, model, max_len: int = 4096, graphs: str = "auto"):
        """`graphs`: "cuda" (capture, on a GPU), "eager" (the same passes, run eagerly), "off" (the
        dynamic path's own passes over the static cells), "auto" (cuda on a GPU, else off)."""
        lean = decoder_for(model)
        if lean is None:
            raise EngineError(f"the static-cache runtime runs Llama-family decoders only, not {type(model).__name__}")
        self.model, self.lean = model, lean
        weight = model.get_input_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        if graphs == "auto":
            graphs = "cuda" if self.device.type == "cuda" else "off"
        if graphs == "cuda" and self.device.type != "cuda":
            raise EngineError("CUDA graphs need the model on a CUDA device")
        self.graphs = graphs
        limit = getattr(model.config, "max_position_embeddings", max_len) or max_len
        self.max_len = min(max_len, limit) // 64 * 64  # cells: a multiple of 64 keeps attention's kernels aligned
        first = lean.layers[0]
        kv_heads = first.kv_size // first.head_dim
        self.kv = torch.zeros(len(lean.layers), 2, kv_heads, self.max_len, first.head_dim,
                              dtype=lean.attention_dtype or self.dtype, device=self.device)
        self.cells = _Cells(self.kv)
        self.passes: dict[int, _Graph] = {}
        self.cache = self  # what the engine asks a prompt cache is asked here
        self.reuse = True
        self.tokens: list[int] = []
        self.prompt_tokens = self.reused_tokens = 0
        self.last_lookup_ms = self.last_prefill_ms = 0.0
        self.prefill_threads = None
        self.exact_rows = SIZES[-1] if graphs != "off" else None  # the widest pass a tree may take
        self.captured_ms = 0.0  # what capturing the graphs took at load
        self._ready: tuple[list[int], torch.Tensor, torch.Tensor] | None = None

    # --- the passes -----------------------------------------------------------------------------

    def _attention(self):
        """cuDNN's attention plans per sequence length (~25 ms each, a new one every step): off."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _eager(self, ids: list[int], past: int, positions: list[int] | None = None,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """The dynamic path's pass over cells past .. past + len(ids): hidden states (n, H)."""
        n = len(ids)
        if past + n > self.max_len:
            raise EngineError(f"{past + n} tokens, over this runtime's {self.max_len}-token context: "
                              "a smaller context_budget")
        positions = positions if positions is not None else list(range(past, past + n))
        cells = self.cells.at(slice(past, past + n), past + n, past)
        with self._attention():
            hidden = self.lean(torch.tensor([ids], device=self.device), cells,
                               torch.tensor([positions], device=self.device), mask)
        return hidden[0]

    def _graph_pass(self, g: _Graph) -> None:
        """What a graph replays: everything from the step's ints to its result, on the device."""
        n, ints = g.size, g.ints
        past, real = ints[0], ints[1]
        tokens, depths, parents = ints[2:2 + n], ints[2 + n:2 + 2 * n], ints[2 + 2 * n:2 + 3 * n]
        visible = ints[2 + 3 * n:].view(n, n).bool()
        cells = torch.arange(self.max_len, device=self.device)
        tree_cell = cells - past  # which node a cell holds, where it holds one
        in_tree = (tree_cell >= 0) & (tree_cell < n)
        sees = (cells < past)[None, :] | (visible[:, tree_cell.clamp(0, n - 1)] & in_tree[None, :])
        mask = torch.zeros(n, self.max_len, dtype=self.kv.dtype, device=self.device)
        mask = mask.masked_fill(~sees, torch.finfo(self.kv.dtype).min)
        view = self.cells.at(past + torch.arange(n, device=self.device), self.max_len, 0)
        hidden = self.lean(tokens[None], view, (past + depths)[None], mask[None, None])[0]
        logits = self.lean.output(hidden)
        greedy = logits.argmax(dim=-1)
        real_nodes = torch.arange(n, device=self.device) < real
        deepest = accept_on_device(tokens, parents, visible, depths, greedy, real_nodes)
        g.hidden, g.logits, g.result = hidden, logits, torch.cat([deepest[None], greedy])

    def _graph(self, nodes: int) -> _Graph:
        size = next(s for s in SIZES if s >= nodes)
        g = self.passes.get(size)
        if g is None:
            g = self.passes[size] = _Graph(size, self.device)
            if self.graphs == "cuda":
                self._capture(g)
        return g

    def _capture(self, g: _Graph) -> None:
        """Warm the pass on a side stream (as torch asks before a capture), then capture it. The
        captured pass writes a padded tree's cells past the sequence: harmless, they are masked."""
        g.ints[2 + 3 * g.size:].view(g.size, g.size).fill_diagonal_(1)
        g.ints[0] = min(len(self.tokens), self.max_len - g.size)  # its cells after the sequence's
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode(), self._attention():
            for _ in range(2):
                self._graph_pass(g)
        torch.cuda.current_stream().wait_stream(stream)
        # A memory pool of its own: with a shared one, replaying one size could overwrite another's
        # outputs (a few MB each for a small model).
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph), torch.inference_mode(), self._attention():
            self._graph_pass(g)

    def _run_graph(self, tree: DraftTree, past: int) -> tuple[_Graph, list[int]]:
        """One pass of the tree after `past` cells: its buffers, and [deepest accepted node, each
        node's greedy token], the step's one copy to the host."""
        n = len(tree)
        g = self._graph(n)  # verify() sends a pass here only where its padded cells fit
        size = g.size
        visible = np.eye(size, dtype=np.int64)
        for node, parent in enumerate(tree.parents):
            if parent >= 0:
                visible[node] |= visible[parent]
        pad = size - n
        row = np.concatenate([[past, n], tree.tokens + [0] * pad, tree.depths + [0] * pad,
                              tree.parents + [-1] * pad, visible.reshape(-1)]).astype(np.int64)
        g.staging.copy_(torch.from_numpy(row))
        g.ints.copy_(g.staging, non_blocking=True)
        if g.graph is not None:
            g.graph.replay()
        else:
            with self._attention():
                self._graph_pass(g)
        result = g.result.tolist()
        return g, result

    # --- the prompt -----------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill_hidden(self, input_ids: list[int], cancel=None):
        """The cache brought to exactly `input_ids`, the longest cached prefix kept; the last
        position's (hidden, logits). Raises Interrupted when `cancel` is set between chunks."""
        started = time.perf_counter()
        self.prompt_tokens += len(input_ids)
        if (warmed := self._warmed(input_ids, started)) is not None:
            return warmed
        keep = self._reuse(input_ids)
        looked_up = time.perf_counter()
        hidden = self._fill(input_ids, keep, cancel)
        self.last_lookup_ms = (looked_up - started) * 1000
        self.last_prefill_ms = (time.perf_counter() - looked_up) * 1000
        if hidden is None:
            raise Interrupted("the prefill was stopped: its request was cancelled")
        self.reused_tokens += keep
        return hidden, self.lean.output(hidden)

    def _reuse(self, input_ids: list[int]) -> int:
        keep = min(len(commonprefix([self.tokens, input_ids])), len(input_ids) - 1) if self.reuse else 0
        self.tokens = self.tokens[:max(0, keep)]
        return len(self.tokens)

    def _fill(self, input_ids: list[int], start: int, cancel, chunk: int = PREFILL_CHUNK) -> torch.Tensor | None:
        """input_ids[start:] into the cache, `chunk` a pass: the last hidden state, or None where
        `cancel` stopped it (the cache keeps the chunks that went in)."""
        hidden = None
        for begin in range(start, len(input_ids), chunk):
            if cancel is not None and cancel.is_set():
                return None
            part = input_ids[begin:begin + chunk]
            hidden = self._eager(part, begin)[-1]
            self.tokens = self.tokens + part
        return hidden

    def warm(self, input_ids: list[int], cancel, chunk: int = 64) -> int:
        """`input_ids` computed ahead of a request, `chunk` tokens a pass; when all are in, their
        (hidden, logits) wait for the request with this very prompt."""
        self._ready = None
        if not input_ids or len(input_ids) + SIZES[-1] > self.max_len:
            return 0
        with torch.inference_mode():
            keep = self._reuse(input_ids)
            hidden = self._fill(input_ids, keep, cancel, chunk)
            if hidden is not None and len(input_ids) > keep:
                self._ready = (list(input_ids), hidden, self.lean.output(hidden))
        return len(self.tokens) - keep

    @torch.inference_mode()
    def append(self, token: int):
        tree = DraftTree()
        tree.add(token, -1, "greedy")
        verified = self.verify(tree)
        self.commit(verified, [0])
        return verified.hidden[0], verified.logits(0)

    @torch.inference_mode()  # entered around each step: a `with` in a generator would leak into its caller
    def steps(self, tokens):
        yield from tokens

    def warm_up(self, token: int) -> None:
        """Every pass size captured (or run once) now, not at the first request."""
        started = time.perf_counter()
        with torch.inference_mode():
            self.clear()
            self._eager([token] * 64, 0)  # a prompt's pass: cuBLAS and attention set up for many rows too
            self.clear()
            self._eager([token], 0)
            if self.graphs != "off":
                for size in SIZES:
                    self._graph(size)
            self.clear()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.captured_ms = (time.perf_counter() - started) * 1000

    def can_crop(self) -> bool:
        return True

    # --- a draft tree ---------------------------------------------------------------------------

    @torch.inference_mode()
    def verify(self, tree: DraftTree, batch_rows: int = 1) -> Verified:
        """One pass over every node of the tree after the cache, each seeing its ancestors."""
        past, n = len(self.tokens), len(tree)
        size = next((s for s in SIZES if s >= n), None)
        if self.graphs == "off" or size is None or past + size > self.max_len:  # near the end: no padding
            if n == 1 or all(tree.parents[i] == i - 1 for i in range(n)):
                hidden = self._eager(tree.tokens, past)  # a chain: the lean decoder's own causal mask
            else:
                mask = tree_attention_mask(tree, past, self.kv.dtype, self.device)
                hidden = self._eager(tree.tokens, past, [past + d for d in tree.depths], mask)
            rows = self.lean.output(hidden)
            return Verified(tree, hidden, lambda node: rows[node], past)
        g, result = self._run_graph(tree, past)
        hidden, logits = g.hidden[:n].clone(), g.logits[:n].clone()  # the buffers are the next replay's
        verified = Verified(tree, hidden, lambda node: logits[node], past)
        verified.greedy_ids, verified.deepest = result[1:1 + n], result[0]
        return verified

    def commit(self, verified: Verified, path: list[int]) -> None:
        """The accepted path's cells moved to follow the cache in order (device indices, one
        gather and one scatter for every layer at once); the rest are left to be overwritten."""
        past = verified.past
        if path != list(range(len(path))):
            source = torch.tensor([past + i for i in path], device=self.device)
            target = torch.arange(past, past + len(path), device=self.device)
            self.kv.index_copy_(3, target, self.kv.index_select(3, source))
        self.tokens = self.tokens + [verified.tree.tokens[i] for i in path]

    # --- what this device charges ---------------------------------------------------------------

    @torch.inference_mode()
    def pass_ms(self, rows: int) -> float:
        """A verification pass of `rows` nodes (a chain of the last token) with every node's logits,
        timed on the device (CUDA events), then undone."""
        tokens = list(self.tokens)
        chain = DraftTree()
        for depth in range(rows):
            chain.add(tokens[-1] if tokens else 0, depth - 1, "calibration")
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            verified = self.verify(chain)
            [verified.greedy_next(i) for i in range(rows)]
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            started = time.perf_counter()
            verified = self.verify(chain)
            [verified.greedy_next(i) for i in range(rows)]
            ms = (time.perf_counter() - started) * 1000
        self.tokens = tokens
        return ms

    def output_batch_rows(self) -> int:
        return 1 << 30  # every node's logits come with the pass

    # --- what the engine asks a prompt cache ------------------------------------------------------

    def clear(self) -> None:
        self._ready = None
        self.tokens = []

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def to_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "hit_rate": round(self.reused_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
                "prefix_tree": None, "prefill_threads": None, "static": True, "max_len": self.max_len,
                "graphs": self.graphs, "pass_sizes": sorted(self.passes), "captured_ms": round(self.captured_ms, 1),
                "kv_bytes": self.kv.numel() * self.kv.element_size()}
