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
Saved beside the model as draft_heads.safetensors + draft_heads.json.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..decoding.verify import Candidate
from ..loading.int8 import quantize_int8
from .base import DraftSource, DraftState, StepOutcome

WEIGHTS_FILE = "draft_heads.safetensors"
CONFIG_FILE = "draft_heads.json"
PACKAGED_HEADS = Path(__file__).parent.parent / "models" / "heads"  # <model folder name>/draft_heads.*


@dataclass
class HeadsConfig:
    hidden_size: int  # the base model's hidden size
    num_heads: int = 4  # K: head k guesses the token k places after the root
    num_layers: int = 1  # residual blocks per head
    vocab_size: int = 0  # N: an output layer of its own over N frequent tokens; 0: the base model's lm_head
    token_input: bool = False  # the heads see the root token's embedding as well as the hidden state
    inner_size: int = 0  # a block's inner width (x + W2 silu(W1 x)); 0: Medusa's x + silu(W x)


class ResBlock(nn.Module):
    """Medusa's block, x + silu(W x), or with `inner_size` an MLP block x + W2 silu(W1 x). Either
    starts as the identity (its last layer is zero)."""

    def __init__(self, hidden_size: int, inner_size: int = 0):
        super().__init__()
        self.linear = nn.Linear(hidden_size, inner_size or hidden_size)
        self.act = nn.SiLU()
        self.down = nn.Linear(inner_size, hidden_size) if inner_size else None
        last = self.down if self.down is not None else self.linear
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.linear(x))
        return x + (self.down(y) if self.down is not None else y)


class DraftHeads(nn.Module):
    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        # A comprehension, not [block] * K: each head needs its own weights.
        self.heads = nn.ModuleList(nn.Sequential(*[ResBlock(h, config.inner_size) for _ in range(config.num_layers)])
                                   for _ in range(config.num_heads))
        self.token_in = nn.Linear(h, h, bias=False) if config.token_input else None
        if self.token_in is not None:
            nn.init.zeros_(self.token_in.weight)  # starts by ignoring the token: the plain Medusa heads
        self.out = nn.Linear(h, config.vocab_size, bias=False) if config.vocab_size else None
        if self.out is not None:
            self.out.weight.requires_grad_(False)  # the model's own rows (attach_output)
        self.register_buffer("vocab_ids", torch.arange(config.vocab_size, dtype=torch.long))

    @torch.no_grad()
    def attach_output(self, lm_head: nn.Module) -> None:
        """The output layer's rows: the model's own lm_head rows of `vocab_ids`."""
        if self.out is not None:
            self.out.weight.copy_(lm_head.weight[self.vocab_ids].to(self.out.weight.dtype))

    def forward(self, hidden: torch.Tensor, token_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) -> (K, ..., H): one transformed hidden state per head. `token_embedding` (..., H):
        the root token's embedding in the base model, for heads with `token_input`."""
        if self.token_in is not None:
            if token_embedding is None:
                raise ValueError("these heads take the root token's embedding too")
            hidden = hidden + self.token_in(token_embedding)
        return torch.stack([head(hidden) for head in self.heads])

    def logits(self, transformed: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """(K, ..., H) -> (K, ..., V'): over the reduced vocabulary (`vocab_ids` maps a column to its
        token), or over the whole one through the base model's `lm_head`."""
        if self.out is not None:
            return self.out(transformed)
        if lm_head is None:
            raise ValueError("these heads use the base model's lm_head: pass it")
        return lm_head(transformed)

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Token ids of logits columns."""
        return self.vocab_ids[columns] if self.out is not None else columns

    def save(self, folder: Path, extra: dict | None = None, dtype: torch.dtype = torch.float32) -> None:
        """The weights (in `dtype`) and config beside a model; `extra` (what they were trained on,
        figures) goes into the config file for people, and is ignored when loading."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
                   for k, v in self.state_dict().items() if k != "out.weight"}  # the model's own rows
        save_file(weights, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=2))

    @classmethod
    def load(cls, folder: Path) -> "DraftHeads | None":
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
            return None
        stored = json.loads((folder / CONFIG_FILE).read_text())
        heads = cls(HeadsConfig(**{k: stored[k] for k in HeadsConfig.__dataclass_fields__ if k in stored}))
        weights = load_file(str(folder / WEIGHTS_FILE))
        weights.setdefault("vocab_ids", heads.vocab_ids)  # heads saved before the reduced vocabulary
        if heads.out is not None:
            weights["out.weight"] = heads.out.weight  # filled by attach_output
        heads.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()})
        return heads.eval()


def heads_folder(model_dir: Path | None) -> Path | None:
    """Where a model's heads are: beside it, else among the packaged ones under the model folder's
    name (a GGUF file's dequantized folder is named after the file and its hash, so packaged heads
    match that very file and no other)."""
    if model_dir is None:
        return None
    model_dir = Path(model_dir)
    if (model_dir / CONFIG_FILE).is_file():
        return model_dir
    packaged = PACKAGED_HEADS / model_dir.name.removesuffix("-shards")  # gguf.dequantized_folder's name
    return packaged if (packaged / CONFIG_FILE).is_file() else None


def gguf_heads_folder(path: Path) -> Path | None:
    """Where the heads of a GGUF file on the llama.cpp runtime are (trained on that runtime's hidden
    states): those `memosight train heads --runtime llamacpp` wrote into the cache, else the
    packaged ones, under the file's name and hash (no other file picks them up)."""
    from ..loading.files import cache_root, file_hash

    name = f"{path.stem}-{file_hash(path)}"
    for folder in (cache_root() / "heads" / "llamacpp" / name, PACKAGED_HEADS / "llamacpp" / name):
        if (folder / CONFIG_FILE).is_file():
            return folder
    return None


class RowEmbedding(nn.Module):
    """A token's input embedding read from a GGUF file's rows (gguf_rows.py), for heads that see
    the root token on the llama.cpp runtime."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1).tolist()
        out = torch.from_numpy(self.rows.embedding(flat[0]) if len(flat) == 1 else self.rows.embedding_rows(flat))
        return out.reshape(*tokens.shape, -1)


class HeadDrafter(DraftSource):
    """Proposes the best paths through the heads' top-k guesses (a small beam over joint probability)."""

    name = "heads"

    def __init__(self, heads: DraftHeads, lm_head: nn.Module, embed: nn.Module | None = None,
                 top_k: tuple[int, ...] = (4, 3, 2, 2), beams: int = 6, confident: float = 0.8,
                 min_prob: float = 0.1, standby: bool | None = None, dtype: torch.dtype | None = None):
        self.heads = heads
        self.lm_head = lm_head
        self.embed = embed  # the base model's input embedding, for heads that see the root token
        # the heads' input dtype
        self.dtype = dtype or (embed.weight.dtype if embed is not None else lm_head.weight.dtype)
        self.top_k = top_k
        self.beams = beams
        # A drafted node costs a row of the verification pass whether or not it is accepted: guesses
        # whose joint probability falls below this are not worth their row.
        self.min_prob = min_prob
        self.confident = confident  # probability above which a guess is also offered as a hint
        # Heads that project onto the whole vocabulary cost K full lm_heads a step: they stand by,
        # asked only when the cheap sources have nothing. Reduced-vocabulary heads cost a small
        # fraction of a step and are always asked.
        self.standby = heads.out is None if standby is None else standby
        self.last_top1: list[int] = []  # each head's first guess at the last ask, to score it
        self.hits: list[int] = []  # per head: times its top-1 was the greedy token
        self.tries: list[int] = []

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> HeadDrafter | None:
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
        """Heads for a GGUF file on the llama.cpp runtime: their output rows and the root token's
        embedding read from the file (float32 rows of the tokens they guess, no torch model)."""
        from ..loading.gguf_rows import GgufRows

        heads = DraftHeads.load(folder)
        rows = GgufRows(path)
        if heads is None or heads.config.hidden_size != rows.hidden_size:
            return None
        if heads.out is not None:
            with torch.no_grad():
                heads.out.weight.copy_(torch.from_numpy(rows.output_rows(heads.vocab_ids.tolist())))
            lm_head = None
        else:  # a small vocabulary's whole output layer (the embedded model's 8,192 rows)
            lm_head = nn.Linear(rows.hidden_size, rows.vocab_size, bias=False)
            with torch.no_grad():
                lm_head.weight.copy_(torch.from_numpy(rows.output_rows(range(rows.vocab_size))))
        embed = RowEmbedding(rows) if heads.token_in is not None else None
        # cheap heads propose wide: the tree sizer keeps the nodes worth their rows
        return cls(heads, lm_head, embed, top_k=(6, 4, 3, 3), beams=12, min_prob=0.02, standby=False,
                   dtype=torch.float32)

    @torch.inference_mode()
    def guesses(self, hidden, root: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k probabilities and token ids per head: (K, k) each, k = max(top_k). `hidden`: a
        tensor, or the llama.cpp runtime's numpy array."""
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
