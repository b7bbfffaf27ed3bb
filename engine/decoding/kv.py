"""KV caches: the one wrapper over the transformers cache API, the prompt cache reused from
keystroke to keystroke, and the prefix tree of earlier prompts' blocks.

transformers 5.x renamed `past_key_values` to `cache` (argument and output) and dropped
`cache_position`; `Cache.crop` takes a negative count. The engine's code (decoding, benchmarks,
training evaluation) reaches the cache API through this module only, so the next rename is a
one-line change here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from os.path import commonprefix  # any two sequences: token ids here

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..runtime.lean import decoder_for


def cache_argument_name(model) -> str:
    return _cache_argument_name(type(model))


@functools.cache
def _cache_argument_name(model_type: type) -> str:  # inspect.signature costs more than a small layer
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class GrowableLayer(DynamicLayer):
    """A full-attention cache layer that writes into a buffer with room to spare instead of
    concatenating: DynamicLayer copies the whole cache on every step, which on a 1,000-token prompt
    was the largest single cost of a decoding step on the CPU. `keys`/`values` stay views of the
    filled part, so whatever reads a DynamicLayer reads this one too."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._key_buffer = self._value_buffer = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, end)
        self._key_buffer[..., self._length:end, :] = key_states
        self._value_buffer[..., self._length:end, :] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = max(256, needed * 3 // 2)  # amortised: a buffer grows rarely
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self._key_buffer is not None:
            keys[..., :self._length, :] = self._key_buffer[..., :self._length, :]
            values[..., :self._length, :] = self._value_buffer[..., :self._length, :]
        self._key_buffer, self._value_buffer = keys, values

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (the tokens to remove)")
        if tokens_to_remove and self._key_buffer is not None:
            self._set_length(max(0, self._length + tokens_to_remove))

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        super().reset()


def new_cache(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    # Only plain full-attention layers are swapped; sliding-window and other kinds keep their own.
    cache.layers = [GrowableLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def transformers_prefill(model, input_ids: list[int]) -> dict:
    """A stock transformers cache holding `input_ids`, prefilled by the model's own forward, as the
    keyword arguments that hand it to `model.generate` (for benchmarks against transformers)."""
    cache = DynamicCache(config=model.config)
    if input_ids:
        # Only the last position's logits, as generate asks for them: the full (T, V) projection
        # would charge transformers for work neither it nor the engine does.
        keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        model(torch.tensor([input_ids], device=next(model.parameters()).device),
              **{cache_argument_name(model): cache}, **keep)
    return {cache_argument_name(model): cache}


def supports_reuse(model) -> bool:
    """Whether the cache can be cropped and compacted: only full-attention layers keep every
    position (sliding-window layers drop old ones, so prefix reuse and tree verification are off)."""
    return all(isinstance(layer, GrowableLayer) for layer in new_cache(model).layers)


def cached_length(cache) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


def crop(cache, keep: int) -> None:
    """Drop everything after the first `keep` positions."""
    drop = cached_length(cache) - keep
    if drop > 0:
        cache.crop(-drop)


def keep_positions(cache, keep: int, extra: list[int]) -> None:
    """Compact the cache to its first `keep` positions followed by positions `extra` (increasing).

    After verifying a draft tree the cache holds every tree node; only the accepted path stays.
    Only the path's entries move (into the slots right after `keep`), then the rest is cropped, so
    the cost does not grow with the prompt.
    """
    if extra != list(range(keep, keep + len(extra))):
        index = None
        for layer in cache.layers:
            if index is None:
                index = torch.tensor(extra, device=layer.keys.device)
            end = keep + len(extra)
            layer.keys[..., keep:end, :] = layer.keys.index_select(-2, index)
            layer.values[..., keep:end, :] = layer.values.index_select(-2, index)
    crop(cache, keep + len(extra))


def forward_hidden(model, input_ids: torch.Tensor, cache, *, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The base model's last hidden state (1, T, H) for `input_ids` appended to `cache`.

    Speculative decoding needs the hidden state (for the draft heads) as well as the logits, so it
    runs the decoder and the lm_head separately instead of asking for every layer's output.
    """
    start = cached_length(cache)
    if position_ids is None:
        position_ids = torch.arange(start, start + input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    lean = decoder_for(model)
    if lean is not None:
        return lean(input_ids, cache, position_ids, attention_mask)
    kwargs = {cache_argument_name(model.base_model): cache}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    out = model.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=True, **kwargs)
    return out.last_hidden_state


class PrefixTree:
    """KV blocks of earlier prompts, keyed by a chained xxhash of their tokens.

    Block i's key hashes every token up to its end, so equal keys mean equal prefixes and a lookup
    walks block by block until the first miss. Least recently used blocks are dropped once the
    stored bytes pass `max_bytes`.
    """

    def __init__(self, block_tokens: int = 64, max_bytes: int = 256 * 2**20):
        from collections import OrderedDict

        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self.blocks: "OrderedDict[int, list[tuple[torch.Tensor, torch.Tensor]]]" = OrderedDict()
        self.bytes = 0
        self.lookups = 0
        self.hit_tokens = 0

    def block_keys(self, tokens: list[int]) -> list[int]:
        import xxhash

        keys, digest = [], b""
        b = self.block_tokens
        for end in range(b, len(tokens) + 1, b):
            h = xxhash.xxh64(digest + torch.tensor(tokens[end - b:end], dtype=torch.int32).numpy().tobytes())
            digest = h.digest()
            keys.append(h.intdigest())
        return keys

    def longest_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the tree holds (a multiple of the block size)."""
        if self.max_bytes <= 0:
            return 0
        n = 0
        for key in self.block_keys(tokens):
            if key not in self.blocks:
                break
            n += self.block_tokens
        return n

    def build_cache(self, model, tokens: list[int], length: int):
        """A fresh cache holding the first `length` tokens; `length` must be a whole number of blocks
        that longest_prefix found."""
        assert length % self.block_tokens == 0, "build_cache takes whole blocks"
        cache = new_cache(model)
        keys = self.block_keys(tokens[:length])
        per_layer: list[list[tuple[torch.Tensor, torch.Tensor]]] = [self.blocks[k] for k in keys]
        self._touch(keys)
        n_layers = len(per_layer[0])
        for layer in range(n_layers):
            k = torch.cat([blk[layer][0] for blk in per_layer], dim=-2)
            v = torch.cat([blk[layer][1] for blk in per_layer], dim=-2)
            cache.update(k, v, layer)
        self.lookups += 1
        self.hit_tokens += length
        return cache

    def store(self, tokens: list[int], cache) -> None:
        """Keep the full blocks of `tokens` (whose KV `cache` holds) that the tree lacks."""
        if self.max_bytes <= 0:
            self.blocks.clear()
            self.bytes = 0
            return
        keys = self.block_keys(tokens[: cached_length(cache)])
        for i, key in enumerate(keys):
            if key in self.blocks:
                continue
            a, b = i * self.block_tokens, (i + 1) * self.block_tokens
            block = [(layer.keys[..., a:b, :].clone(), layer.values[..., a:b, :].clone()) for layer in cache.layers]
            self.blocks[key] = block
            self.bytes += sum(k.numel() * k.element_size() * 2 for k, _ in block)
        self._touch(keys)
        self.evict()

    def evict(self) -> None:
        """Drop the least recently used blocks until the tree fits in max_bytes."""
        while self.bytes > self.max_bytes and self.blocks:
            _, block = self.blocks.popitem(last=False)
            self.bytes -= sum(k.numel() * k.element_size() * 2 for k, _ in block)

    def _touch(self, keys: list[int]) -> None:
        # Deepest first, so a prefix's first block is always its most recently used: eviction
        # then takes chains from their ends and never strands blocks behind a missing parent.
        for key in reversed(keys):
            self.blocks.move_to_end(key)

    def stats(self) -> dict:
        return {"blocks": len(self.blocks), "bytes": self.bytes, "max_bytes": self.max_bytes,
                "block_tokens": self.block_tokens, "hit_tokens": self.hit_tokens, "lookups": self.lookups}


class PromptCache:
    """The KV cache of the last prompt, reused when the next prompt starts with the same tokens.

    Consecutive keystrokes share most of their prompt, so only the changed tail is prefilled.
    """

    def __init__(self, prefix_tree: PrefixTree | None = None) -> None:
        self.tokens: list[int] = []
        self.cache = None
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.prefix_tree = prefix_tree  # earlier prompts' blocks, for prompts that do not extend the last one
        self.reuse = True  # off for models whose cache cannot be cropped (sliding-window attention)
        self.prefill_threads = None  # threads.PrefillThreads on a multi-core CPU
        # the last prefill_hidden's two parts, in ms: finding and rebuilding the cached prefix, and
        # the forward over the rest (a request's latency breakdown reads them)
        self.last_lookup_ms = 0.0
        self.last_prefill_ms = 0.0
        # (prompt, last hidden state, logits) of a warm-up that computed a whole prompt: what
        # prefill_hidden returns without a forward pass when the request's prompt is that one
        self._ready: tuple[list[int], torch.Tensor, torch.Tensor] | None = None
        # (the text it was rendered from, the prompt) of the last prompt rendered: a request after
        # its warm-up renders nothing. With the KV and _ready this is everything a warm-up leaves
        # for its request on the engine's side, in one place. Not model state: clear() keeps it.
        self._rendered: tuple[tuple, object] | None = None

    def _reuse(self, model, input_ids: list[int]) -> int:
        """Bring the cache to the longest reusable prefix of `input_ids`; returns its length."""
        keep = min(len(commonprefix([self.tokens, input_ids])), len(input_ids) - 1)
        if self.cache is None:
            keep = 0
        if not self.reuse:
            self.cache = new_cache(model)
            return 0
        if self.prefix_tree is not None:
            block = self.prefix_tree.block_tokens
            from_tree = min(self.prefix_tree.longest_prefix(input_ids), len(input_ids) - 1) // block * block
            if from_tree > keep:
                self.cache = self.prefix_tree.build_cache(model, input_ids, from_tree)
                return from_tree
        if keep <= 0:
            self.cache = new_cache(model)
            return 0
        crop(self.cache, keep)
        return keep

    def rendered(self, key: tuple):
        """The prompt last rendered from `key` (the text and how it was rendered), or None."""
        return self._rendered[1] if self._rendered is not None and self._rendered[0] == key else None

    def remember_rendered(self, key: tuple, prompt) -> None:
        self._rendered = (key, prompt)

    def remember(self) -> None:
        """Store the current prompt's blocks in the prefix tree (after a request)."""
        if self.prefix_tree is not None and self.cache is not None:
            self.prefix_tree.store(self.tokens, self.cache)

    def prefill_hidden(self, model, input_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to exactly `input_ids`; the last hidden state and the logits after it.

        Only the tail past the reusable prefix runs; the last token too, for its logits, unless a
        warm-up computed exactly this prompt a moment ago."""
        started = time.perf_counter()
        if self._ready is not None and self._ready[0] == input_ids == self.tokens \
                and cached_length(self.cache) == len(input_ids):
            _, last, logits = self._ready
            self._ready = None
            self.prompt_tokens += len(input_ids)
            self.reused_tokens += len(input_ids)
            self.last_lookup_ms, self.last_prefill_ms = (time.perf_counter() - started) * 1000, 0.0
            return last, logits
        self._ready = None
        keep = self._reuse(model, input_ids)
        looked_up = time.perf_counter()
        self.tokens = list(input_ids[:keep])  # what the cache holds, should the forward fail
        device = next(model.parameters()).device
        tail = input_ids[keep:]
        if self.prefill_threads is None:
            hidden = forward_hidden(model, torch.tensor([tail], device=device), self.cache)
        else:  # a try of another thread count runs on the first chunk only
            for start, end, probe in self.prefill_threads.chunks(len(tail)):
                with self.prefill_threads.for_prefill(end - start, probe):
                    hidden = forward_hidden(model, torch.tensor([tail[start:end]], device=device), self.cache)
                self.tokens = list(input_ids[:keep + end])
        self.tokens = list(input_ids)
        self.prompt_tokens += len(input_ids)
        self.reused_tokens += keep
        last = hidden[0, -1]
        logits = model.get_output_embeddings()(last)
        done = time.perf_counter()
        self.last_lookup_ms, self.last_prefill_ms = (looked_up - started) * 1000, (done - looked_up) * 1000
        return last, logits

    @torch.inference_mode()
    def warm(self, model, input_ids: list[int], cancel, chunk: int = 64) -> int:
        """Bring the cache to all of `input_ids`, `chunk` tokens a forward pass, stopping between
        passes once `cancel` is set; once all are in, the logits after them wait for the request
        with this very prompt (an edit and no more typing: it decodes at once). Not counted as a
        prompt: the request that follows counts what it finds here. Returns the positions computed now."""
        self._ready = None
        keep = self._reuse(model, input_ids)
        self.tokens = list(input_ids[:keep])
        device = next(model.parameters()).device
        position = keep
        while position < len(input_ids) and not cancel.is_set():
            end = min(position + chunk, len(input_ids))
            # tries of another thread count belong to requests' prefills (their first chunk): here
            # a slow try would hold up the request that cancels this warm-up
            with self.prefill_threads.for_prefill(end - position, probe=False) if self.prefill_threads \
                    else contextlib.nullcontext():
                hidden = forward_hidden(model, torch.tensor([input_ids[position:end]], device=device), self.cache)
            position = end
            self.tokens = list(input_ids[:position])
        if position == len(input_ids) and position > keep:
            # the whole prompt, its last token included: the request finds its first logits ready
            last = hidden[0, -1]
            self._ready = (list(input_ids), last, model.get_output_embeddings()(last))
        return position - keep

    def append(self, model, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one more token; the last hidden state and the logits after it."""
        device = next(model.parameters()).device
        hidden = forward_hidden(model, torch.tensor([[token]], device=device), self.cache)
        self.tokens.append(token)
        last = hidden[0, -1]
        return last, model.get_output_embeddings()(last)

    def set_max_bytes(self, max_bytes: int) -> None:
        """The memory bound of the prefix tree; evicts down to it at once."""
        if self.prefix_tree is not None and self.prefix_tree.max_bytes != max_bytes:
            self.prefix_tree.max_bytes = max_bytes
            self.prefix_tree.evict()

    def clear(self) -> None:
        """Forget the last prompt (the prefix tree keeps its blocks)."""
        self.tokens, self.cache, self._ready = [], None, None

    def forget_all(self) -> None:
        """Forget the last prompt and every stored block (cold-start measurements)."""
        self.clear()
        if self.prefix_tree is not None:
            self.prefix_tree = PrefixTree(self.prefix_tree.block_tokens, self.prefix_tree.max_bytes)

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "hit_rate": round(self.reused_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
            "prefix_tree": self.prefix_tree.stats() if self.prefix_tree is not None else None,
            "prefill_threads": self.prefill_threads.to_json() if self.prefill_threads is not None else None,
        }
