"""Decoding loops: the plain greedy loop (the reference), and streaming text with stop rules."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from . import kv
from .request import StopRule
from .stops import apply_stop_rule, held_back


@dataclass
class PrefillStats:
    prompt_tokens: int
    reused_tokens: int  # served from the cache the previous request left


class PromptCache:
    """The KV cache of the last prompt, reused when the next prompt starts with the same tokens.

    Consecutive keystrokes share most of their prompt, so only the changed tail is prefilled.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.cache = None
        self.prompt_tokens = 0
        self.reused_tokens = 0

    def prefill(self, model, input_ids: list[int]) -> tuple[torch.Tensor, PrefillStats]:
        """Bring the cache to exactly `input_ids` and return the logits after the last one."""
        keep = kv.common_prefix_length(self.tokens, input_ids)
        keep = min(keep, len(input_ids) - 1)  # the last token is always run to get its logits
        if self.cache is None or keep <= 0:
            self.cache, keep = kv.new_cache(model), 0
        else:
            kv.crop(self.cache, keep)
        device = next(model.parameters()).device
        tail = torch.tensor([input_ids[keep:]], device=device)
        out = kv.forward(model, tail, self.cache)
        self.tokens = list(input_ids)
        self.prompt_tokens += len(input_ids)
        self.reused_tokens += keep
        return out.logits[0, -1], PrefillStats(len(input_ids), keep)

    def append(self, model, token: int) -> torch.Tensor:
        device = next(model.parameters()).device
        out = kv.forward(model, torch.tensor([[token]], device=device), self.cache)
        self.tokens.append(token)
        return out.logits[0, -1]

    def clear(self) -> None:
        self.tokens, self.cache = [], None


@torch.inference_mode()
def greedy_tokens(model, input_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                  prompt_cache: PromptCache, cancel: threading.Event | None = None) -> Iterator[int]:
    """Plain greedy decoding with a KV cache; yields each new token, EOS included."""
    if max_new_tokens <= 0:
        return
    logits, _ = prompt_cache.prefill(model, input_ids)
    for step in range(max_new_tokens):
        if cancel is not None and cancel.is_set():
            return
        token = int(torch.argmax(logits))
        yield token
        if token in eos_ids or step == max_new_tokens - 1:
            return
        logits = prompt_cache.append(model, token)


@dataclass
class StreamState:
    text: str = ""  # the completion so far, after stop rules
    emitted: int = 0  # characters already streamed out
    tokens: int = 0
    stop_reason: str = "max_tokens"


def stream_text(tokens: Iterable[int], decode, stop: StopRule, end_ids: set[int],
                state: StreamState) -> Iterator[str]:
    """Turn a token stream into text pieces, applying the stop rules.

    `decode(ids)` maps token ids to text. Pieces never include text that a stop rule later cuts.
    """
    generated: list[int] = []
    for token in tokens:
        state.tokens += 1
        if token in end_ids:
            state.stop_reason = "eos"
            break
        generated.append(token)
        raw = decode(generated)
        if raw.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            continue
        cut = apply_stop_rule(raw, stop)
        state.text = cut.text
        if cut.reason is not None:
            state.stop_reason = cut.reason
            break
        safe = len(cut.text) - held_back(cut.text, stop)
        if safe > state.emitted:
            yield cut.text[state.emitted:safe]
            state.emitted = safe
    else:
        if generated:
            state.text = apply_stop_rule(decode(generated).rstrip("\ufffd"), stop).text
    if len(state.text) > state.emitted:
        yield state.text[state.emitted:]
        state.emitted = len(state.text)
