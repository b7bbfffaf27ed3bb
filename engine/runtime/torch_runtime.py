"""The torch runtime: a transformers model and its prompt cache (kv.PromptCache) behind the runtime
interface. The GPU, training, and the Python API's bit-exact contract run here."""

from __future__ import annotations

import time

import torch

from ..decoding import kv
from ..decoding.verify import DraftTree, tree_attention_mask
from . import Verified
from .lean import output_layer


class TorchRuntime:
    name = "torch"
    max_branches = 1 << 30  # a tree of any shape in one pass (the attention mask says who sees whom)

    def __init__(self, model, prompt_cache: kv.PromptCache):
        self.model = model
        self.cache = prompt_cache  # the last prompt's KV, earlier prompts' blocks, what a warm-up left

    def warm_up(self, token: int) -> None:
        """One token through a fresh cache: what a first forward builds (the lean decoder, packed
        weights, compiled kernels) is not the first request's to wait for."""
        with torch.no_grad():  # not inference_mode: the fused weights it makes must stay trainable
            device = next(self.model.parameters()).device
            hidden = kv.forward_hidden(self.model, torch.tensor([[token]], device=device), kv.new_cache(self.model))
            self.model.get_output_embeddings()(hidden[0, -1])

    def can_crop(self) -> bool:
        """Sliding-window caches drop old positions: no cropping, so no reuse and no tree verification."""
        return kv.supports_reuse(self.model)

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # --- the prompt: what PromptCache does, for this model -----------------------------------------

    @property
    def tokens(self) -> list[int]:
        return self.cache.tokens

    @tokens.setter
    def tokens(self, ids: list[int]) -> None:
        self.cache.tokens = ids

    @property
    def reused_tokens(self) -> int:
        return self.cache.reused_tokens

    @property
    def last_lookup_ms(self) -> float:
        return self.cache.last_lookup_ms

    @property
    def last_prefill_ms(self) -> float:
        return self.cache.last_prefill_ms

    @torch.inference_mode()
    def prefill_hidden(self, input_ids: list[int], cancel=None):
        return self.cache.prefill_hidden(self.model, input_ids)  # one forward: `cancel` is checked after it

    @torch.inference_mode()
    def append(self, token: int):
        return self.cache.append(self.model, token)

    def warm(self, input_ids: list[int], cancel, chunk: int = 64) -> int:
        return self.cache.warm(self.model, input_ids, cancel, chunk)

    @torch.inference_mode()
    def steps(self, tokens):
        yield from tokens

    # --- a draft tree --------------------------------------------------------------------------

    @torch.inference_mode()
    def verify(self, tree: DraftTree, batch_rows: int = 1) -> Verified:
        """One forward pass over every node of the tree, each seeing only its ancestors. The logits
        are computed only for the nodes the accepted path reaches: on a CPU a float output layer
        costs as much as a layer or two, and a matrix of a few rows costs two to three times one row
        (measured: 12,288 x 256 output layer, 0.42 ms for 1 row, 0.92 ms for 2, 2.8 ms for 17;
        SmolLM2's 49,152 x 576: 10 ms for 1 or 2 rows, 21 for 4), while a path is usually a node or
        two. Where `batch_rows` rows cost about what one does (an int8 output layer: 1.4 ms for 1 to
        16 rows), the first `batch_rows` nodes get theirs in one go."""
        model, cache = self.model, self.cache.cache
        past = kv.cached_length(cache)
        device = next(model.parameters()).device  # where the input ids go, as in the prompt cache
        ids = torch.tensor([tree.tokens], device=device)
        if len(tree) == 1:
            hidden = kv.forward_hidden(model, ids, cache)
        else:
            positions = torch.tensor([[past + d for d in tree.depths]], device=device)
            # additive, in the activations' dtype (an int8 model's stay float)
            mask = tree_attention_mask(tree, past, model.get_input_embeddings().weight.dtype, device)
            hidden = kv.forward_hidden(model, ids, cache, attention_mask=mask, position_ids=positions)
        hidden = hidden[0]
        head, rows = output_layer(model), max(1, min(batch_rows, len(tree)))
        batch: dict[int, torch.Tensor] = {}

        def logits_of(node: int) -> torch.Tensor:
            if node < rows and len(tree) > 1:
                if not batch:
                    batch.update(enumerate(head(hidden[:rows])))
                return batch[node]
            return head(hidden[node])

        return Verified(tree, hidden, logits_of, past)

    def commit(self, verified: Verified, path: list[int]) -> None:
        """Keep the accepted path's entries in the KV cache, drop the other nodes'."""
        if len(verified.tree) > 1:
            kv.keep_positions(self.cache.cache, verified.past, [verified.past + i for i in path])
        self.cache.tokens = self.cache.tokens + [verified.tree.tokens[i] for i in path]

    # --- what this device charges ----------------------------------------------------------------

    @torch.inference_mode()
    def pass_ms(self, rows: int) -> float:
        """A verification pass of `rows` nodes (a chain of the last token), timed; the cache is cut
        back after it."""
        past = kv.cached_length(self.cache.cache)
        token = self.cache.tokens[-1] if self.cache.tokens else 0
        chain = DraftTree()
        for depth in range(rows):
            chain.add(token, depth - 1, "calibration")
        started = time.perf_counter()
        verified = self.verify(chain)
        for node in range(rows):
            verified.greedy_next(node)
        ms = (time.perf_counter() - started) * 1000
        kv.crop(self.cache.cache, past)
        return ms

    @torch.inference_mode()
    def output_batch_rows(self) -> int:
        """Rows of the output layer that cost about one row's time (1.25x at most)."""
        head = output_layer(self.model)
        embedding = self.model.get_input_embeddings().weight
        hidden = embedding[:1]  # a row of the activations' width, dtype and device
        ms = {}
        for rows in (1, 1, 2, 4, 8, 16, 32):  # 1 twice: the first call warms up
            batch = hidden.expand(rows, -1).contiguous()
            started = time.perf_counter()
            head(batch)
            ms[rows] = (time.perf_counter() - started) * 1000
        return max(rows for rows in ms if ms[rows] <= 1.25 * ms[1])
