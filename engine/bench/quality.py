"""How well a model predicts code it has never seen (`memosight bench quality`).

On any folder of source files it measures
  - held-out loss and top-1 next-token accuracy (files joined with <|endoftext|>, packed windows),
  - next-line exact match: the cursor sits after a line's indentation; the model sees the file
    above the cursor (plain prefix) or also the text below the line (FIM: prefix + suffix), decodes
    greedily until a newline, and must reproduce the rest of the line exactly (trailing blanks ignored).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..fim import arrange
from ..kv import PromptCache
from ..speculate import greedy_tokens
from ..train.corpus import read_folder
from ..train.data import eval_windows
from ..train.loop import evaluate


@dataclass
class LineSample:
    path: str
    line: int  # 1-based
    prefix: str  # the file above the cursor (the cursor is after the line's indentation)
    suffix: str  # from the end of the target line on
    target: str  # the rest of the line, what the model must write


@dataclass
class QualityReport:
    model: str
    corpus: str
    files: int
    tokens: int  # predictions scored for loss/accuracy
    loss: float
    top1_accuracy: float
    next_line_samples: int
    next_line_exact: float  # plain prefix
    next_line_fim_exact: float  # prefix + suffix
    fim_order: str  # psm or spm
    seconds: float
    examples: list[dict] = field(default_factory=list)


def sample_lines(path: str, text: str, per_file: int, rng) -> list[LineSample]:
    """Lines worth completing: at least 3 visible characters, not the file's first line."""
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    candidates = [i for i, line in enumerate(lines) if i > 0 and len(line.strip()) >= 3]
    chosen = sorted(rng.sample(candidates, min(per_file, len(candidates))))
    samples = []
    for i in chosen:
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        cursor = offsets[i] + indent
        end = offsets[i] + len(line)
        samples.append(LineSample(path, i + 1, text[:cursor], text[end:], line[indent:].rstrip()))
    return samples


class LineCompleter:
    """Greedy single-line completion with a Hugging Face causal LM (plain or StarCoder FIM)."""

    def __init__(self, model, tokenizer, prefix_tokens: int, suffix_tokens: int, max_new_tokens: int,
                 fim_order: str = "psm"):
        self.model, self.tokenizer, self.fim_order = model, tokenizer, fim_order
        self.prefix_tokens, self.suffix_tokens, self.max_new_tokens = prefix_tokens, suffix_tokens, max_new_tokens
        vocab = tokenizer.get_vocab()
        self.fim_ids = [vocab.get(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")]
        self.newline_ids = {i for i in range(len(tokenizer)) if "\n" in tokenizer.decode([i])}

    def prompt_ids(self, prefix: str, suffix: str | None) -> list[int]:
        encode = lambda s: self.tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
        prefix_ids = encode(prefix)[-self.prefix_tokens :]
        if suffix is None:
            return prefix_ids
        if None in self.fim_ids:
            raise ValueError("this tokenizer has no <fim_prefix>/<fim_suffix>/<fim_middle> tokens")
        return arrange(*self.fim_ids, prefix_ids, encode(suffix)[: self.suffix_tokens], self.fim_order)

    def complete(self, prefix: str, suffix: str | None = None) -> str:
        """The rest of the line: greedy tokens until a newline, EOS or the limit."""
        ids = self.prompt_ids(prefix, suffix)
        ends = {self.tokenizer.eos_token_id, *self.fim_ids}
        out: list[int] = []
        for token in greedy_tokens(self.model, ids, self.max_new_tokens, ends, PromptCache()):
            if token in ends:
                break
            out.append(token)
            if token in self.newline_ids:
                break
        return self.tokenizer.decode(out).split("\n", 1)[0]


def run_quality(corpus_dir: str, model_dir: str | Path, *, max_files: int | None = None,
                extensions: tuple[str, ...] = (".py",), seq_len: int = 1024, max_tokens: int = 100_000,
                lines_per_file: int = 4, prefix_tokens: int = 768, suffix_tokens: int = 192,
                max_new_tokens: int = 48, seed: int = 0, examples: int = 0, fim_order: str = "psm") -> QualityReport:
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    files = read_folder(corpus_dir, extensions=extensions, max_files=max_files)
    if not files:
        raise FileNotFoundError(f"no {', '.join(extensions)} files under {corpus_dir}")

    held_out = evaluate(model, eval_windows(tokenizer, [f.text for f in files], seq_len, max_tokens), autocast=False)

    rng = random.Random(seed)
    samples = [s for f in files for s in sample_lines(f.path, f.text, lines_per_file, rng)]
    completer = LineCompleter(model, tokenizer, prefix_tokens, suffix_tokens, max_new_tokens, fim_order)
    plain_hits = fim_hits = 0
    shown: list[dict] = []
    for sample in samples:
        plain = completer.complete(sample.prefix)
        fim = completer.complete(sample.prefix, sample.suffix)
        plain_hits += plain.rstrip() == sample.target
        fim_hits += fim.rstrip() == sample.target
        if len(shown) < examples:
            shown.append({"path": sample.path, "line": sample.line, "target": sample.target,
                          "plain": plain, "fim": fim})
    n = max(len(samples), 1)
    return QualityReport(str(model_dir), str(corpus_dir), len(files), held_out.tokens, held_out.loss,
                         held_out.accuracy, len(samples), plain_hits / n, fim_hits / n, fim_order, time.time() - started,
                         shown)


def format_table(report: QualityReport) -> str:
    rows = [
        ("model", report.model),
        ("corpus", f"{report.corpus} ({report.files} files)"),
        ("held-out loss", f"{report.loss:.4f} nats/token over {report.tokens:,} tokens"),
        ("top-1 next-token accuracy", f"{report.top1_accuracy:.2%}"),
        ("next-line exact match (prefix)", f"{report.next_line_exact:.2%} of {report.next_line_samples} lines"),
        (f"next-line exact match (FIM, {report.fim_order.upper()})",
         f"{report.next_line_fim_exact:.2%} of {report.next_line_samples} lines"),
        ("wall time", f"{report.seconds:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
