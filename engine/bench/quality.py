"""How well a model predicts code it has never seen (`memosight bench quality`).

On any folder of source files, for any model the engine loads (a folder, a GGUF file, a packaged
name), it measures
  - held-out loss, bits per character and top-1 next-token accuracy (files joined with
    <|endoftext|>, packed windows),
  - next-line exact match: the cursor sits after a line's indentation; the model sees the file
    above the cursor (plain prefix), with and without token healing, or also the text below the
    line (FIM: prefix + suffix, for models with FIM tokens), decodes greedily to the end of the
    line, and must reproduce the rest of the line exactly (trailing blanks ignored); and the share
    of the lines' characters it got right as a prefix.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch

from ..engines.local import LocalEngine
from ..protocol import CompletionRequest, RequestOptions, StopRule
from ..train.corpus import read_folder
from ..train.data import eval_windows
from ..train.loop import evaluate_with_predictions


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
    loss: float  # nats per token
    bits_per_char: float  # the same loss per character of text: comparable across tokenizers
    top1_accuracy: float
    next_line_samples: int
    next_line_exact: float  # plain prefix, token healing
    next_line_exact_unhealed: float  # plain prefix, the prompt ending exactly at the cursor
    next_line_prefix_chars: float  # plain prefix, healed: share of the lines' characters right as a prefix
    next_line_fim_exact: float | None  # prefix + suffix, healed; None for a model without FIM tokens
    fim_order: str  # psm or spm
    seconds: float
    examples: list[dict] = field(default_factory=list)
    dtype: str = "float32"  # what the engine ran in (int8's cost is read against a float32 reference)
    reference_dtype: str | None = None  # the same model in another dtype, run on the same windows
    reference_loss: float | None = None
    reference_bits_per_char: float | None = None
    agreement_with_reference: float | None = None  # share of positions with the reference's greedy token


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
    """Greedy completion of the rest of a line through the engine, from a prompt cut to a budget."""

    def __init__(self, engine: LocalEngine, prefix_tokens: int, suffix_tokens: int, max_new_tokens: int):
        self.engine = engine
        self.prefix_tokens, self.suffix_tokens, self.max_new_tokens = prefix_tokens, suffix_tokens, max_new_tokens

    def _cut(self, text: str, tokens: int, from_end: bool) -> str:
        ids = self.engine.encode(text)
        if len(ids) <= tokens:
            return text
        return self.engine.decode(ids[-tokens:] if from_end else ids[:tokens])

    def complete(self, prefix: str, suffix: str | None = None, heal: bool = True) -> str:
        """The rest of the line; `suffix` None: the prefix alone, else the model's FIM prompt."""
        request = CompletionRequest(self._cut(prefix, self.prefix_tokens, True),
                                    self._cut(suffix, self.suffix_tokens, False) if suffix else "",
                                    max_new_tokens=self.max_new_tokens, stop=StopRule(single_line=True),
                                    options=RequestOptions(heal=heal, fim=suffix is not None))
        return self.engine.stream(request).result().text


def correct_prefix(guess: str, target: str) -> int:
    n = 0
    while n < min(len(guess), len(target)) and guess[n] == target[n]:
        n += 1
    return n


def text_chars(engine: LocalEngine, windows: torch.Tensor) -> int:
    """The characters of text the windows' predictions cover (special tokens not counted)."""
    return sum(len(engine.tokenizer.decode(w[1:].tolist(), skip_special_tokens=True)) for w in windows)


def bits_per_char(loss: float, tokens: int, chars: int) -> float:
    """A held-out loss (nats per token) per character of the text it was measured on."""
    return loss * tokens / math.log(2) / max(chars, 1)


def run_quality(corpus_dir: str, engine: LocalEngine, *, max_files: int | None = None,
                extensions: tuple[str, ...] = (".py",), seq_len: int = 1024, max_tokens: int = 100_000,
                lines_per_file: int = 4, prefix_tokens: int = 768, suffix_tokens: int = 192,
                max_new_tokens: int = 48, seed: int = 0, examples: int = 0,
                reference: LocalEngine | None = None) -> QualityReport:
    """`reference`: the same model in another dtype (float32 beside int8): its loss on the same
    windows, and how often the two agree on the next token."""
    started = time.time()
    files = read_folder(corpus_dir, extensions=extensions, max_files=max_files)
    if not files:
        raise FileNotFoundError(f"no {', '.join(extensions)} files under {corpus_dir}")

    windows = eval_windows(engine.tokenizer, [f.text for f in files], seq_len, max_tokens).to(engine.device)
    with torch.inference_mode():
        held_out, predicted = evaluate_with_predictions(engine.model, windows, autocast=False)
    chars = text_chars(engine, windows)
    bpc = bits_per_char(held_out.loss, held_out.tokens, chars)
    compared = {}
    if reference is not None:
        with torch.inference_mode():
            ref, ref_predicted = evaluate_with_predictions(reference.model, windows, autocast=False)
        compared = {"reference_dtype": reference.status()["dtype"], "reference_loss": ref.loss,
                    "reference_bits_per_char": bits_per_char(ref.loss, ref.tokens, chars),  # the same text
                    "agreement_with_reference": float((predicted == ref_predicted).float().mean())}

    rng = random.Random(seed)
    samples = [s for f in files for s in sample_lines(f.path, f.text, lines_per_file, rng)]
    completer = LineCompleter(engine, prefix_tokens, suffix_tokens, max_new_tokens)
    hits = {"plain": 0, "unhealed": 0, "fim": 0}
    right_chars = total_chars = 0
    shown: list[dict] = []
    for sample in samples:
        guesses = {"plain": completer.complete(sample.prefix),
                   "unhealed": completer.complete(sample.prefix, heal=False)}
        if engine.fim.has_fim:
            guesses["fim"] = completer.complete(sample.prefix, sample.suffix)
        for mode, guess in guesses.items():
            hits[mode] += guess.rstrip() == sample.target
        right_chars += correct_prefix(guesses["plain"], sample.target)
        total_chars += len(sample.target)
        if len(shown) < examples:
            shown.append({"path": sample.path, "line": sample.line, "target": sample.target, **guesses})
    n = max(len(samples), 1)
    return QualityReport(engine.name, str(corpus_dir), len(files), held_out.tokens, held_out.loss, bpc,
                         held_out.accuracy, len(samples), hits["plain"] / n, hits["unhealed"] / n,
                         right_chars / max(total_chars, 1), hits["fim"] / n if engine.fim.has_fim else None,
                         engine.fim_order, time.time() - started, shown, engine.status()["dtype"], **compared)


def format_table(report: QualityReport) -> str:
    rows = [
        ("model", report.model),
        ("corpus", f"{report.corpus} ({report.files} files)"),
        ("held-out loss", f"{report.loss:.4f} nats/token over {report.tokens:,} tokens"),
        ("bits per character", f"{report.bits_per_char:.3f}"),
        ("top-1 next-token accuracy", f"{report.top1_accuracy:.2%}"),
        ("next-line exact match (prefix)", f"{report.next_line_exact:.2%} of {report.next_line_samples} lines"),
        ("  without token healing", f"{report.next_line_exact_unhealed:.2%}"),
        ("  characters right as a prefix", f"{report.next_line_prefix_chars:.2%}"),
        (f"next-line exact match (FIM, {report.fim_order.upper()})",
         f"{report.next_line_fim_exact:.2%} of {report.next_line_samples} lines"
         if report.next_line_fim_exact is not None else "- (the model has no FIM tokens)"),
        ("wall time", f"{report.seconds:.1f} s"),
    ]
    if report.reference_dtype:
        change = report.bits_per_char / report.reference_bits_per_char - 1
        rows[4:4] = [(f"  {report.reference_dtype} on the same text", f"{report.reference_bits_per_char:.3f} "
                      f"({report.dtype}: {change:+.2%})"),
                     (f"  next token as {report.reference_dtype}'s", f"{report.agreement_with_reference:.2%}")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
