"""The records of a training run: its knobs, what a checkpoint holds besides the tensors, and a
held-out figure. Apart from the loop, so that the model card (export.py) reads them without the loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import ModelConfig
from .optim import Schedule


@dataclass
class TrainConfig:
    seq_len: int = 1024  # tokens per training window
    batch_size: int = 8  # windows per optimizer step
    tokens: int = 20_000_000  # total training tokens; sets the number of steps and the LR schedule
    lr: float = 2e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100  # linear warmup
    weight_decay: float = 0.1  # on matrices only, not norms
    beta2: float = 0.95
    grad_clip: float = 1.0
    fim_rate: float = 0.5  # share of samples in FIM format
    spm_rate: float = 0.5  # share of FIM samples in SPM order (the rest PSM)
    seed: int = 1337  # model init, data order and FIM splits
    eval_every: int = 200  # steps between quick held-out evaluations
    eval_tokens: int = 60_000  # held-out tokens for the quick evaluations
    checkpoint_every: int = 100  # steps between checkpoints
    bf16: bool = True  # bf16 autocast (CPU)
    max_minutes: float = 0.0  # wall-clock budget: the LR decays to its floor and training stops by then; 0 = none

    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.seq_len))

    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.warmup_steps, self.steps(), self.min_lr_ratio, self.max_minutes)


@dataclass
class RunState:
    """Everything a checkpoint holds besides the tensors; also what the model card reports."""

    model_config: ModelConfig
    train_config: TrainConfig
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0  # wall time spent in the training loop, summed over resumes
    command: list[str] = field(default_factory=list)  # one entry per launch (first, then resumes)
    history: list[dict] = field(default_factory=list)  # quick evaluations: step, tokens, loss, accuracy
    corpus: list[str] = field(default_factory=list)  # the --corpus values, reused on resume
    val_fraction: float = 0.03  # share of files held out by content hash


@dataclass
class HeldOut:
    loss: float  # mean next-token cross-entropy (nats)
    accuracy: float  # top-1 next-token accuracy
    tokens: int  # predictions scored
