"""Auxiliary draft heads (Medusa-style) on the base model's last hidden state.

Head k (k = 1..K) guesses the token k positions after the certain next token (the root, which the
base model's own lm_head gives): a residual block (zero-initialised, so it starts as the identity)
and an output layer. Two refinements for real models (each a field of HeadsConfig):
- `token_input`: the heads also see the root token (its embedding in the base model, through a
  learned projection). Medusa's head 1 must guess token t+2 without knowing t+1; here t+1 is known
  whenever the heads are asked, so head 1 only has to guess one token ahead of a known one.
- `vocab_size`: the output layer covers the N tokens the model writes most often in code (their ids
  in `vocab_ids`) instead of the whole vocabulary: a 49k-token lm_head costs a fifth of a 135M
  model's decoding step, 8k rows a thirtieth. Those rows are the model's own lm_head's, frozen
  (as Medusa keeps its lm_head), so they are not saved: `attach_output` takes them from the model
  at load. The base model's full logits still verify every guess, so the output stays exactly
  greedy's; a token outside the N is only never guessed.
The embedded model's heads have neither (its vocabulary is small) and use the base lm_head.
Saved beside the model as draft_heads.safetensors + draft_heads.json. The torch modules (training,
the torch runtime) are in head_layers.py; on the llama.cpp runtime the same weights run in numpy
(NumpyHeads), so that its process never imports torch.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np

from ..decoding.verify import Candidate
from .base import DraftSource, DraftState, StepOutcome
from .heads_files import CONFIG_FILE, WEIGHTS_FILE, HeadsConfig, heads_folder, read_safetensors

class NumpyHeads:
    """The heads' forward in numpy, float32, for the llama.cpp runtime: the weights DraftHeads saves
    (head_layers.py), the output rows and the root token's embedding read from the GGUF file."""

    def __init__(self, config: HeadsConfig, weights: dict[str, np.ndarray], output_rows: np.ndarray,
                 vocab_ids: np.ndarray, rows=None):
        self.config = config
        self.blocks = [[(weights[f"heads.{k}.{j}.linear.weight"], weights[f"heads.{k}.{j}.linear.bias"],
                         weights.get(f"heads.{k}.{j}.down.weight"), weights.get(f"heads.{k}.{j}.down.bias"))
                        for j in range(config.num_layers)] for k in range(config.num_heads)]
        self.token_in = weights.get("token_in.weight") if config.token_input else None
        self.output_rows = output_rows  # (V', H): the model's own rows of the tokens the heads guess
        self.vocab_ids = vocab_ids  # column -> token id
        self.rows = rows  # the file's rows, for the root token's embedding

    @classmethod
    def load(cls, folder: Path, path: Path) -> NumpyHeads | None:
        from ..loading.gguf_rows import GgufRows

        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            return None
        stored = json.loads((folder / CONFIG_FILE).read_text())
        config = HeadsConfig(**{k: stored[k] for k in HeadsConfig.__dataclass_fields__ if k in stored})
        rows = GgufRows(path)
        if config.hidden_size != rows.hidden_size:
            return None
        weights = read_safetensors(folder / WEIGHTS_FILE)
        # a reduced vocabulary's rows, or (the embedded model's 8,192 tokens) the whole output layer
        vocab_ids = weights.get("vocab_ids", np.arange(config.vocab_size)) if config.vocab_size \
            else np.arange(rows.vocab_size)
        output = np.ascontiguousarray(rows.output_rows(vocab_ids.tolist()), dtype=np.float32)
        return cls(config, weights, output, vocab_ids.astype(np.int64), rows if config.token_input else None)

    def guesses(self, hidden: np.ndarray, root: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k probabilities and token ids per head, (K, k) each."""
        x = np.asarray(hidden, dtype=np.float32).reshape(-1)
        if self.token_in is not None:
            x = x + self.token_in @ np.asarray(self.rows.embedding(root), dtype=np.float32)
        transformed = []
        for blocks in self.blocks:
            h = x
            for weight, bias, down, down_bias in blocks:
                y = weight @ h + bias
                y = y / (1.0 + np.exp(-y))  # silu
                h = h + (down @ y + down_bias if down is not None else y)
            transformed.append(h)
        logits = np.stack(transformed) @ self.output_rows.T  # (K, V')
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argpartition(-probs, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(-probs, top, axis=1).argsort(axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        return np.take_along_axis(probs, top, axis=1), self.vocab_ids[top]


class HeadDrafter(DraftSource):
    """Proposes the best paths through the heads' top-k guesses (a small beam over joint probability)."""

    name = "heads"

    def __init__(self, heads, lm_head=None, embed=None,
                 top_k: tuple[int, ...] = (4, 3, 2, 2), beams: int = 6, confident: float = 0.8,
                 min_prob: float = 0.1, standby: bool | None = None, dtype=None):
        self.heads = heads  # DraftHeads (head_layers.py, on torch) or NumpyHeads (on llama.cpp)
        self.lm_head = lm_head
        self.embed = embed  # the base model's input embedding, for heads that see the root token
        # the heads' input dtype (torch's)
        self.dtype = dtype if dtype is not None or isinstance(heads, NumpyHeads) else (
            embed.weight.dtype if embed is not None else lm_head.weight.dtype)
        self.top_k = top_k
        self.beams = beams
        # A drafted node costs a row of the verification pass whether or not it is accepted: guesses
        # whose joint probability falls below this are not worth their row.
        self.min_prob = min_prob
        self.confident = confident  # probability above which a guess is also offered as a hint
        # Heads that project onto the whole vocabulary cost K full lm_heads a step: they stand by,
        # asked only when the cheap sources have nothing. Reduced-vocabulary heads cost a small
        # fraction of a step and are always asked.
        self.standby = getattr(heads, "out", None) is None if standby is None else standby
        self.last_top1: list[int] = []  # each head's first guess at the last ask, to score it
        self.hits: list[int] = []  # per head: times its top-1 was the greedy token
        self.tries: list[int] = []

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> HeadDrafter | None:
        if model is None:  # the llama.cpp runtime: its heads come with the file (for_gguf)
            return None
        import torch

        from ..loading.int8 import quantize_int8
        from .head_layers import DraftHeads

        if not isinstance(model, torch.nn.Module):  # heads run beside a torch model's output layer
            return None
        folder = heads_folder(model_dir)
        heads = DraftHeads.load(folder) if folder is not None else None
        if heads is None or heads.config.hidden_size != model.config.hidden_size:
            return None
        lm_head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        heads.attach_output(lm_head)
        weight = embed.weight  # an int8 output layer has no float weight to read the dtype from
        heads.to(device=weight.device, dtype=weight.dtype)
        if heads.out is None:
            return cls(heads, lm_head, embed if heads.token_in is not None else None)
        def drafter(heads: DraftHeads) -> HeadDrafter:
            # Cheap heads propose wide: the tree sizer (sizing.py) keeps the nodes worth their rows.
            return cls(heads, lm_head, embed if heads.token_in is not None else None, top_k=(6, 4, 3, 3), beams=12,
                       min_prob=0.02)

        if weight.device.type != "cpu":
            return drafter(heads)
        # Guesses need not be exact (the model verifies them), so int8 where it is clearly faster here:
        # on a Xeon with AMX it halved a draft (SmolLM2's heads, 1 thread: 1.35 ms against 2.75 in
        # float32); oneDNN's AVX2 int8 kernels are slow. Timed, best of 5 each, a fixed input.
        as_float, as_int8 = drafter(heads), drafter(quantize_int8(copy.deepcopy(heads)))
        hidden = torch.ones(1, model.config.hidden_size, dtype=weight.dtype, device=weight.device)
        int8_ms, float_ms = (_best_ms(lambda: d.guesses(hidden, 0)) for d in (as_int8, as_float))
        return as_int8 if int8_ms * INT8_MIN_SPEEDUP <= float_ms else as_float

    @classmethod
    def for_gguf(cls, path: Path, folder: Path) -> HeadDrafter | None:
        """Heads for a GGUF file on the llama.cpp runtime, in numpy: their output rows and the root
        token's embedding read from the file (float32 rows of the tokens they guess, no torch)."""
        heads = NumpyHeads.load(folder, path)
        if heads is None:
            return None
        # They propose wide (the tree sizer keeps the nodes worth their rows) but stand by: asked
        # only when the n-grams have nothing. Asked every step (4.9 ms a time for Qwen2.5-Coder-0.5B,
        # 2 cores), they made drafted steps look dear and the controller went plain, n-grams with
        # them: spec_all 42.6 tok/s against spec_ngram's 53.6; standing by, 48.6 (plain 46.3).
        return cls(heads, top_k=(6, 4, 3, 3), beams=12, min_prob=0.02, standby=True)

    def guesses(self, hidden, root: int):
        """Top-k probabilities and token ids per head: (K, k) each, k = max(top_k): numpy arrays from
        NumpyHeads, tensors from DraftHeads (`hidden` a tensor, or the llama.cpp runtime's array)."""
        if isinstance(self.heads, NumpyHeads):
            return self.heads.guesses(hidden, root, max(self.top_k))
        import torch

        with torch.inference_mode():
            if not isinstance(hidden, torch.Tensor):
                hidden = torch.from_numpy(hidden)
            token = None
            if self.embed is not None:
                token = self.embed(torch.tensor(root, device=hidden.device)).to(self.dtype)
            logits = self.heads.logits(self.heads(hidden.to(self.dtype), token), self.lm_head)  # (K, V')
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, max(self.top_k), dim=-1)
            return top.values, self.heads.token_ids(top.indices)

    def propose(self, state: DraftState) -> list[Candidate]:
        self.last_top1 = []
        if state.hidden is None:
            return []
        probs, tokens = self.guesses(state.hidden, state.context[-1])
        depth = min(len(self.top_k), probs.shape[0], state.max_len)
        probs, tokens = probs.tolist(), tokens.tolist()
        self.last_top1 = [tokens[d][0] for d in range(len(probs))]
        confident = []  # the first guesses, for as long as each is likely: a hint for later steps
        for d in range(len(probs)):
            if probs[d][0] < self.confident:
                break
            confident.append(tokens[d][0])
        beams: list[tuple[float, list[int]]] = [(1.0, [])]
        kept: list[tuple[float, list[int]]] = []  # every beam prefix worth its row; the tree merges prefixes
        for d in range(depth):
            grown = [(p * probs[d][j], seq + [tokens[d][j]]) for p, seq in beams for j in range(self.top_k[d])]
            beams = [b for b in sorted(grown, key=lambda b: -b[0])[: self.beams] if b[0] >= self.min_prob]
            kept.extend(beams)
        out = [Candidate(seq, self.name, score=p) for p, seq in kept]
        if confident:
            out.append(Candidate(confident, self.name, hint=True))
        return out

    def observe(self, outcome: StepOutcome) -> None:
        """Score each head's first guess against what greedy decoding chose there."""
        if self.name not in outcome.proposals or not outcome.verified:
            return
        truth = outcome.accepted + [outcome.next_token]
        for d in range(min(len(self.last_top1), len(truth))):
            while len(self.hits) <= d:
                self.hits.append(0)
                self.tries.append(0)
            self.tries[d] += 1
            self.hits[d] += int(self.last_top1[d] == truth[d])

    def reset(self) -> None:
        self.last_top1, self.hits, self.tries = [], [], []

    def stats(self) -> dict:
        return {"head_accuracy": [round(h / t, 4) if t else 0.0 for h, t in zip(self.hits, self.tries)]}


INT8_MIN_SPEEDUP = 1.10  # int8 heads only when this much faster: a closer call flips with the machine's load


def _best_ms(call, runs: int = 5) -> float:
    call()  # the first call packs weights and warms caches
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1000
