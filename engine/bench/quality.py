"""`memosight bench quality`: how well a model predicts code it has never seen.

On any folder of source files it measures
  - held-out loss and top-1 next-token accuracy (files joined with <|endoftext|>, packed windows),
  - next-line exact match: the cursor sits after a line's indentation; the model sees the file
    above the cursor (plain prefix) or also the text below the line (FIM: prefix + suffix), decodes
    greedily until a newline, and must reproduce the rest of the line exactly (trailing blanks ignored).

    memosight bench quality --corpus /work/data/eval [--model DIR] [--json] [--max-files N]

Top-level imports stay light: `memosight --help` imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fim import arrange


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR", help="folder of source files to evaluate on")
    parser.add_argument("--model", metavar="DIR", help="model folder (default: the embedded engine/models/default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--max-files", type=int, help="evaluate at most this many files (sorted by path)")
    parser.add_argument("--ext", action="append", help="file extension to read, repeatable (default .py)")
    parser.add_argument("--seq-len", type=int, default=1024, help="window for loss/accuracy (default 1024)")
    parser.add_argument("--max-tokens", type=int, default=100_000, help="cap on tokens scored for loss/accuracy")
    parser.add_argument("--lines-per-file", type=int, default=4, help="next-line samples per file (default 4)")
    parser.add_argument("--prefix-tokens", type=int, default=768, help="prompt budget for the text above the cursor")
    parser.add_argument("--suffix-tokens", type=int, default=192, help="prompt budget for the text below (FIM)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="decode limit per line")
    parser.add_argument("--fim-order", default="psm", choices=("psm", "spm"),
                        help="FIM prompt order: psm = <fim_prefix>P<fim_suffix>S<fim_middle>, "
                        "spm = <fim_prefix><fim_suffix>S<fim_middle>P (StarCoder SPM)")
    parser.add_argument("--seed", type=int, default=0, help="chooses the sampled lines")
    parser.add_argument("--show", type=int, default=0, help="print this many sampled completions to stderr")


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
        import torch

        ids = self.prompt_ids(prefix, suffix)
        out: list[int] = []
        with torch.no_grad():
            result = self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            cache = result.cache
            for step in range(self.max_new_tokens):
                token = int(result.logits[0, -1].argmax())
                if token == self.tokenizer.eos_token_id or token in self.fim_ids:
                    break
                out.append(token)
                if token in self.newline_ids:
                    break
                position = torch.tensor([[len(ids) + step]])
                result = self.model(input_ids=torch.tensor([[token]]), cache=cache, position_ids=position,
                                    use_cache=True, logits_to_keep=1)
                cache = result.cache
        return self.tokenizer.decode(out).split("\n", 1)[0]


def default_model_dir() -> Path:
    import memosight.engine.models as models

    return Path(models.__file__).parent / "default"


def run_quality(corpus_dir: str, model_dir: str | Path, *, max_files: int | None = None,
                extensions: tuple[str, ...] = (".py",), seq_len: int = 1024, max_tokens: int = 100_000,
                lines_per_file: int = 4, prefix_tokens: int = 768, suffix_tokens: int = 192,
                max_new_tokens: int = 48, seed: int = 0, examples: int = 0, fim_order: str = "psm") -> QualityReport:
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..train.corpus import read_folder
    from ..train.model import eval_windows, evaluate

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


def run(args: argparse.Namespace) -> int:
    model_dir = Path(args.model) if args.model else default_model_dir()
    if not (model_dir / "config.json").exists():
        print(f"no model in {model_dir}", file=sys.stderr)
        return 2
    report = run_quality(args.corpus, model_dir, max_files=args.max_files,
                         extensions=tuple(args.ext or [".py"]), seq_len=args.seq_len, max_tokens=args.max_tokens,
                         lines_per_file=args.lines_per_file, prefix_tokens=args.prefix_tokens,
                         suffix_tokens=args.suffix_tokens, max_new_tokens=args.max_new_tokens, seed=args.seed,
                         examples=args.show, fim_order=args.fim_order)
    for example in report.examples:
        print(f"{example['path']}:{example['line']}\n  target {example['target']!r}\n  plain  {example['plain']!r}"
              f"\n  fim    {example['fim']!r}", file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print(format_table(report))
    return 0
