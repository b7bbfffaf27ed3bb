"""`memosight bench context --corpus DIR --budget N [--json]`: the context compressor against plain
left truncation at the same token budget, on real source files.

  identifier recall   at the start of code lines (not comments or docstrings), the identifiers of the
                      true next line that first appear more than 30 lines above the cursor (or are
                      defined in another open file): the share found in the context; separately, the
                      share of those absent from the 30 lines above the cursor; and the share whose
                      first line (definition, import, first use; this file) is itself in the context.
                      That last one is the recall the 1.5x target is read against: most far names are
                      used again near the cursor, so truncation already shows the bare name about
                      three times in four (no context could then score 1.5x its share), while only the
                      first line says what the name is.
  next line           per budget (--budget 256,512,1024: the same cursors at each), the next line
                      under each context: the model's greedy line (healed; skipped with --no-model
                      or --no-generate), exact or not, and the characters of it right before its
                      first error; the true line's loss (nats per token), which moves before a small
                      model's exact match does; each context's first-request latency (the whole
                      prompt prefilled, cold: to the line's end, and to its first token) and prompt
                      size. Contexts: the packed one, plain
                      truncation at the same budget and at twice it, and the packed one with each
                      region kind of --ablate switched off or with the weights of a --variant
                      (attention=N: the model's own attention over the N tokens above the cursor as
                      a region score, engine/decoding/attention.py). By group: all cursors, what the next
                      line uses (a name absent from the 30 lines above; a name only another file
                      defines; neither), and the file's length.
  needle              a constant / helper defined thousands of lines away or in another open file
                      and used at the cursor: is its definition in the context?
  prefix stability    typing a line char by char inside a function: the share of the prompt's prefix
                      tokens identical to the previous keystroke's
  build time          per keystroke (incremental parse included), on a 2,000-line file

The cursor's line is removed from the file first (the user is writing it), so neither context can
contain it. Up to 6 files of the same package count as open in the editor (each with one row drawn
as where the user last was: llama.vim's ring holds the chunk around it, the packer gets it as a
recent edit), and the project as the workspace (the corpus's top-level folder holding the file: a
corpus of attrs/ click/ requests/ is three workspaces), whose unopened files may give definitions
too (as in the server). Without a model (--no-model) tokens are counted by a word/punctuation proxy.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from ..languages import LANGUAGES_BY_SUFFIX
from ..context.regions import REGION_KINDS
from ..documents import Document
from .common import MODEL_HELP, CommandError, add_json_argument, print_result
from ..bench.context_measures import PROXY_TOKEN, needle_figures, recall_and_match, typing_stability
from ..bench.keystroke_cells import keystroke_cells, recompute_counts
from ..bench.keystroke_cells import table as keystroke_table
from ..bench.suffix_length import suffix_lengths
from ..bench.suffix_length import table as suffix_table

# Beside the packed context: plain left truncation at the same budget and at twice it; llama.vim's
# window (256 lines before the cursor, 64 after, cut to the budget) at the same budget and at twice it,
# and cut to the packed prompt's own size (which leaves room to type into: window_same);
# and the window after chunks of the other open files (llama.vim's ring), within the same budget.
BASELINES = ("truncated", "truncated_2x", "window", "window_2x", "window_same", "window_chunks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of source files (held-out code)")
    parser.add_argument("--budget", type=_budgets, default=[512],
                        help="prompt token budget, or several: 256,512,1024 (default 512)")
    parser.add_argument("--suffix-share", type=float, default=None,
                        help="share of the budget after the cursor (default 0.25; 0 for a model without FIM tokens, "
                             "as the server does: its prompt has no suffix)")
    parser.add_argument("--max-positions", type=int, default=300, help="cursor positions for recall (default 300)")
    parser.add_argument("--em-positions", type=int, default=60,
                        help="of those, how many also get the next-line exact-match test (default 60)")
    parser.add_argument("--open-files", type=int, default=6, help="other open files of the same package")
    parser.add_argument("--no-model", action="store_true", help="skip the model: proxy token counts, no exact match")
    parser.add_argument("--no-generate", action="store_true",
                        help="the true line's loss only, no greedy line (quick; for ablations)")
    parser.add_argument("--contexts", type=lambda v: [k for k in v.split(",") if k], default=list(BASELINES),
                        help="the baselines the next-line test runs beside the packed context (default all): "
                             + ", ".join(BASELINES))
    parser.add_argument("--ablate", type=lambda v: [k for k in v.split(",") if k], default=[],
                        help=f"also pack with each of these region kinds switched off: {','.join(REGION_KINDS)} "
                             "(or all)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="also pack with other weights (regions.WEIGHTS), near_prefix_share, suffix_share or "
                             "suffix_tokens (the server's bound on the text after the cursor); "
                             "repeatable")
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--device", help="auto, cpu, cuda")
    parser.add_argument("--dtype", help="auto, float32, bfloat16, float16, int8 (as in .memosight.toml)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--suffix-lengths", type=_lengths, metavar="N,N,...",
                        help="measure only what the text after the cursor is worth by its length in tokens "
                             "(the server's suffix_tokens), e.g. 0,16,32,64,256: the next line's loss under one "
                             "prefix, paired against the longest (--em-positions cursors, --budget)")
    parser.add_argument("--recompute", type=_recomputes, metavar="R,R,...",
                        help="measure only what a keystroke's moved cells cost (llama.cpp, a GGUF model): the rest "
                             "of the true line after a burst, the cache brought there as a keystroke brings it with "
                             "R tokens of each moved run computed again, against a fresh prefill, e.g. 0,4,8,16,32,all "
                             "(--em-positions cursors, half inside functions, half at their end)")
    parser.add_argument("--burst-chars", type=_burst, default=(1, 6), metavar="MIN,MAX",
                        help="with --recompute: characters typed in the burst (default 1,6)")
    parser.add_argument("--suffix-tokens", type=int, default=256,
                        help="with --recompute: the server's suffix_tokens (default 256)")
    parser.add_argument("--cursors-out", metavar="FILE",
                        help="write each next-line cursor's results to FILE (JSON lines: one a cursor and "
                             "budget, per context)")
    add_json_argument(parser)


def _budgets(value: str) -> list[int]:
    try:
        budgets = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        budgets = []
    if not budgets or min(budgets) < 16:
        raise argparse.ArgumentTypeError(f"{value!r}: give token budgets of 16 or more, e.g. 512 or 256,512,1024")
    return budgets


def _lengths(value: str) -> list[int]:
    try:
        lengths = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        lengths = []
    if len(lengths) < 2 or min(lengths) < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: give two or more token counts of 0 or more, e.g. 0,32,256")
    return lengths


def _recomputes(value: str) -> list[int]:
    try:
        return recompute_counts(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give token counts of 0 or more, or all, e.g. 0,8,16,all") from None


def _burst(value: str) -> tuple[int, int]:
    try:
        low, high = (int(v) for v in value.split(","))
    except ValueError:
        low = high = 0
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"{value!r}: give MIN,MAX characters, 1 <= MIN <= MAX, e.g. 1,6")
    return low, high


def proxy_tokens(text: str) -> list[str]:
    return PROXY_TOKEN.findall(text)


def run(args: argparse.Namespace) -> int:
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise CommandError(f"{corpus} is not a folder; fetch real code first, e.g.\n"
                           "  pip download --no-deps attrs click requests -d /tmp/w && unzip /tmp/w/*.whl -d DIR")
    engine = None
    if not args.no_model:
        from memosight.engine import load_engine  # torch: only when a model is wanted

        try:
            engine = load_engine(args.model, device=args.device, dtype=args.dtype)
        except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
            raise CommandError(f"{exc} (use --no-model to run without one)") from exc
    count_tokens = engine.count_tokens if engine else (lambda text: len(proxy_tokens(text)))
    encode = engine.encode if engine else proxy_tokens
    if args.suffix_share is None:
        args.suffix_share = 0.0 if engine is not None and not engine.info().has_fim else 0.25

    files = []
    for path in sorted(corpus.rglob("*")):
        language = LANGUAGES_BY_SUFFIX.get(path.suffix)
        if path.is_file() and language in ("python", "javascript", "typescript", "go", "rust"):
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.count("\n") >= 80:
                files.append(Document(path.resolve().as_uri(), text, language))
    if not files:
        raise CommandError(f"no source files of 80+ lines under {corpus}")
    if args.ablate == ["all"]:
        args.ablate = list(REGION_KINDS)
    unknown = set(args.ablate) - set(REGION_KINDS)
    if unknown:
        raise CommandError(f"--ablate: unknown region kind(s) {', '.join(sorted(unknown))}; "
                           f"choose from {', '.join(REGION_KINDS)} or all")
    unknown = set(args.contexts) - set(BASELINES)
    if unknown:
        raise CommandError(f"--contexts: unknown context(s) {', '.join(sorted(unknown))}; choose from "
                           f"{', '.join(BASELINES)}")
    if args.cursors_out:
        Path(args.cursors_out).write_text("", encoding="utf-8")  # this run's cursors only
    budgets, args.budget = args.budget, args.budget[0]  # needles and typing: at the first budget
    # the modes that measure one thing alone, each with a model
    for flag, values, measure, render in (("--recompute", args.recompute, keystroke_cells, keystroke_table),
                                          ("--suffix-lengths", args.suffix_lengths, suffix_lengths, suffix_table)):
        if values:
            if engine is None:
                raise CommandError(f"{flag} scores the true line with a model: leave out --no-model")
            out = measure(files, args, count_tokens, engine, random.Random(args.seed), values)
            print_result(out, args.json, render, cpu=True)
            return 0
    out = {"corpus": str(corpus), "files": len(files), "suffix_share": args.suffix_share,
           "tokens": "model" if engine else "proxy (--no-model)"}
    per_budget = {}
    for budget in budgets:  # the same cursors at each budget (one seed)
        per_budget[budget] = {"budget": budget,
                              **recall_and_match(files, args, count_tokens, engine, random.Random(args.seed), budget)}
    out.update(per_budget[budgets[0]])
    if len(budgets) > 1:
        out["budgets"] = {str(b): result for b, result in per_budget.items()}
    out.update(needle_figures(files, args, count_tokens))
    out.update(typing_stability(files, args, count_tokens, encode))
    print_result(out, args.json, _table, cpu=True)
    return 0


def _versus(t: dict) -> str:
    if "loss_minus_packed" not in t:
        return ""
    low, high = t["ci95"]
    return f"{t['loss_minus_packed']:+.4f} [{low:+.4f}, {high:+.4f}]"


def _table(out: dict) -> str:
    def fmt(value, pct=False):
        if value is None:
            return "-"
        return f"{value * 100:.1f}%" if pct else str(value)

    lines = [f"context benchmark: {out['files']} files under {out['corpus']}, budget {out['budget']} tokens "
             f"({out['tokens']}), suffix share {out['suffix_share']}"]
    rows = [("identifier recall (far, next line)", fmt(out.get("recall_compressed"), True),
             fmt(out.get("recall_truncated"), True),
             f"x{out['recall_ratio']}" if out.get("recall_ratio") else "-"),
            ("  ... absent from the 30 lines above", fmt(out.get("far_only_recall_compressed"), True),
             fmt(out.get("far_only_recall_truncated"), True),
             f"x{out['far_only_recall_ratio']}" if out.get("far_only_recall_ratio") else "-"),
            ("  ... their first line in context *", fmt(out.get("origin_recall_compressed"), True),
             fmt(out.get("origin_recall_truncated"), True),
             f"x{out['origin_recall_ratio']}" if out.get("origin_recall_ratio") else "-"),
            ("needle in context", f"{out['needle_found']}/{out['needle_cases']}", "-", ""),
            ("prefix stability while typing", fmt(out.get("stability_compressed"), True),
             fmt(out.get("stability_truncated"), True), f"{out.get('typing_keystrokes', 0)} keystrokes"),
            ("build time p50 / p95 (ms)", f"{out.get('build_ms_p50')} / {out.get('build_ms_p95')}", "-",
             f"{out.get('file_lines')}-line file"),
            ("  ... first in a file just opened", f"{out.get('build_cold_ms_p50')} / {out.get('build_cold_ms_max')}",
             "-", "p50 / max: parse and analysis")]
    lines.append(f"{'':<36} {'compressed':>12} {'truncated':>12}   note")
    lines.extend(f"{name:<36} {a:>12} {b:>12}   {note}" for name, a, b, note in rows)
    lines.append(f"({out['positions']} cursor positions at code lines; {out['far_identifiers']} far identifiers, "
                 f"{out['far_only_identifiers']} of them absent from the 30 lines above)")
    lines.append("* the recall the 1.5x target is read against (see memosight bench context --help)")
    for budget, result in (out.get("budgets") or {str(out["budget"]): out}).items():
        if "next_line" not in result:
            continue
        lines.append(f"\nnext line at budget {budget} (_2x: at {2 * int(budget)} tokens; window: llama.vim's 256 lines "
                     "before and 64 after; window_chunks: with chunks of the other open files)")
        lines.append(f"{'cursors':<18} {'context':<32} {'exact':>7} {'prefix chars':>13} {'loss':>7} "
                     f"{'first ms p50':>12} {'1st token':>9} {'prompt':>7}   loss - packed [95% interval]")
        for group, by_name in result["next_line"].items():
            for i, (name, t) in enumerate(by_name.items()):
                label = f"{group} ({t['positions']})" if i == 0 else ""
                exact = f"{t['exact_lines']}/{t['positions']}" if "exact_lines" in t else "-"
                lines.append(f"{label:<18} {name:<32} {exact:>7} {fmt(t.get('prefix_chars')):>13} "
                             f"{fmt(t['line_loss']):>7} {fmt(t.get('first_request_ms_p50')):>12} "
                             f"{fmt(t.get('first_token_ms_p50')):>9} "
                             f"{fmt(t['prompt_tokens_p50']):>7}   {_versus(t)}")
    lines.append("(cursors: by what the next line uses: far = a name absent from the 30 lines above, other_file = "
                 "a name only another file defines, near = neither; and by the length of the file)")
    return "\n".join(lines)
