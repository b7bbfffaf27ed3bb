"""Counting the n-gram draft table: what follows every context of 1..max_order tokens in the
training split of the corpus (the split `train model` uses, so held-out files stay unseen).

With `distill_tokens` it counts the model's own greedy choice after each context instead of the
corpus's next token, since that is what verification accepts (the measured gain is in the
`memosight train ngrams` help).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..decoding import kv
from ..drafts.ngram import NgramTable
from ..loading.torch_load import load_on_torch, load_tokenizer
from ..protocol import EngineError, EngineSpec
from . import Progress
from .corpus import build_corpus, resolve_sources


@dataclass
class NgramCount:
    table: NgramTable
    positions: int  # token positions counted
    files: int  # training files they came from
    distilled: bool  # the model's greedy choices were counted, not the corpus's next tokens
    seconds: float  # tokenizing, running the model (when distilled) and counting


def count_ngrams(model: str | None, corpus_specs: list[str], *, val_fraction: float = 0.03, max_order: int = 4,
                 min_count: int = 8, distill_tokens: int = 0, device: str | None = None,
                 progress: Progress | None = None) -> NgramCount:
    """The table for `model`'s tokenizer (None: the embedded model's). Raises EngineError (the
    loader's ModelLoadError is one) for what the user can fix."""
    tokenizer = load_tokenizer(model)
    corpus = build_corpus(resolve_sources(corpus_specs), val_fraction=val_fraction)
    if not corpus.train:
        raise EngineError("the corpus is empty; give a folder of source code")
    started = time.perf_counter()
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    texts = [f.text for f in corpus.train]
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    tokens = np.fromiter((t for ids in encoded for t in (*ids, end)), dtype=np.int64)
    following = None
    if distill_tokens > 0:
        tokens, following = greedy_choices(model, device, tokens, distill_tokens, progress=progress)
    table = NgramTable.build(tokens, max_order=max_order, min_count=min_count, following=following)
    return NgramCount(table, len(tokens), len(texts), following is not None, time.perf_counter() - started)


def greedy_choices(model: str | None, device: str | None, tokens: np.ndarray, budget: int, window: int = 1024,
                   progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Windows of `tokens` spread evenly over the stream, up to `budget` tokens, and the model's
    greedy next token at each of their positions."""
    engine = load_on_torch(EngineSpec(model, device=device, dtype="float32"))
    window = min(window, getattr(engine.model.config, "max_position_embeddings", None) or window)
    starts = list(range(0, max(1, len(tokens) - window), window))
    keep = max(1, min(len(starts), budget // window))
    starts = [starts[round(i * len(starts) / keep)] for i in range(keep)]
    lm_head = engine.model.get_output_embeddings()
    windows, choices = [], []
    with torch.inference_mode():
        for done, start in enumerate(starts, 1):
            piece = tokens[start:start + window]
            ids = torch.tensor([piece.tolist()], device=engine.device)
            hidden = kv.forward_hidden(engine.model, ids, kv.new_cache(engine.model))
            windows.append(piece)
            choices.append(lm_head(hidden[0]).argmax(-1).cpu().numpy())
            if progress:
                progress(done, len(starts), {})
    return np.concatenate(windows), np.concatenate(choices)
