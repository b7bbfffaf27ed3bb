"""`memosight bench quality --corpus DIR [--json]`: how well a model predicts code it has never seen.

On any folder of source files, for any model the engine loads, it measures
  - held-out loss, bits per character and top-1 next-token accuracy,
  - next-line exact match: the cursor sits after a line's indentation; the model sees the file
    above the cursor (plain prefix, with and without token healing) or also the text below the
    line (FIM: prefix + suffix, for models with FIM tokens), decodes greedily until a newline, and
    must reproduce the rest of the line exactly (trailing blanks ignored); and the share of the
    lines' characters it got right as a prefix.

    memosight bench quality --corpus /work/data/eval [--model DIR|FILE.gguf|smollm2-135m] [--json]
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from .common import CommandError, add_json_argument, print_result, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR", help="folder of source files to evaluate on")
    parser.add_argument("--model", help="model folder, GGUF file, packaged name (smollm2-135m) or Hugging Face id "
                                        "(default: the embedded model)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    parser.add_argument("--dtype", default="float32", help="float32 (default) | int8 | bfloat16 | float16: "
                                                             "int8's quality cost is float32's figures beside it")
    parser.add_argument("--against", metavar="DTYPE", help="also load the model in DTYPE (e.g. float32 beside "
                        "--dtype int8): its bits/char on the same text and the share of next tokens the two agree on")
    add_json_argument(parser)
    parser.add_argument("--max-files", type=int, help="evaluate at most this many files (sorted by path)")
    parser.add_argument("--ext", action="append", help="file extension to read, repeatable (default .py)")
    parser.add_argument("--seq-len", type=int, default=1024, help="window for loss/accuracy (default 1024)")
    parser.add_argument("--max-tokens", type=int, default=100_000, help="cap on tokens scored for loss/accuracy")
    parser.add_argument("--lines-per-file", type=int, default=4, help="next-line samples per file (default 4)")
    parser.add_argument("--prefix-tokens", type=int, default=768, help="prompt budget for the text above the cursor")
    parser.add_argument("--suffix-tokens", type=int, default=192, help="prompt budget for the text below (FIM)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="decode limit per line")
    parser.add_argument("--fim-order", choices=("psm", "spm"),
                        help="FIM prompt order (default: the model's own): psm = <fim_prefix>P<fim_suffix>S<fim_middle>, "
                        "spm = <fim_prefix><fim_suffix>S<fim_middle>P (StarCoder SPM)")
    parser.add_argument("--seed", type=int, default=0, help="chooses the sampled lines")
    parser.add_argument("--show", type=int, default=0, help="print this many sampled completions to stderr")


def run(args: argparse.Namespace) -> int:
    from memosight.engine import load_engine
    from memosight.engine.bench.quality import format_table, run_quality

    if not Path(args.corpus).is_dir():
        raise CommandError(f"corpus folder {args.corpus!r} does not exist; give a folder of source files")
    # torch's: the figures read the model's own logits (a model that fails: EngineError)
    engine = load_engine(args.model, device=args.device, dtype=args.dtype, runtime="torch")
    reference = load_engine(args.model, device=args.device, dtype=args.against, runtime="torch") if args.against else None
    if args.fim_order:
        engine.fim_order = args.fim_order
    try:
        report = run_quality(args.corpus, engine, max_files=args.max_files,
                             extensions=tuple(args.ext or [".py"]), seq_len=args.seq_len, max_tokens=args.max_tokens,
                             lines_per_file=args.lines_per_file, prefix_tokens=args.prefix_tokens,
                             suffix_tokens=args.suffix_tokens, max_new_tokens=args.max_new_tokens, seed=args.seed,
                             examples=args.show, reference=reference)
    except FileNotFoundError as exc:  # no files of that kind
        raise CommandError(str(exc)) from exc
    for example in report.examples:
        say("\n".join([f"{example['path']}:{example['line']}", f"  target   {example['target']!r}"] +
                       [f"  {mode:<8} {example[mode]!r}" for mode in ("plain", "unhealed", "fim") if mode in example]))
    print_result(asdict(report), args.json, lambda _: format_table(report), cpu=True)
    return 0
