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
                      prompt prefilled, cold) and prompt size. Contexts: the packed one, plain
                      truncation at the same budget and at twice it, and the packed one with each
                      region kind of --ablate switched off or with the weights of a --variant
                      (attention=N: the model's own attention over the N tokens above the cursor as
                      a region score, engine/attention.py). By group: all cursors, what the next
                      line uses (a name absent from the 30 lines above; a name only another file
                      defines; neither), and the file's length.
  needle              a constant / helper defined thousands of lines away or in another open file
                      and used at the cursor: is its definition in the context?
  prefix stability    typing a line char by char inside a function: the share of the prompt's prefix
                      tokens identical to the previous keystroke's
  build time          per keystroke (incremental parse included), on a 2,000-line file

The cursor's line is removed from the file first (the user is writing it), so neither context can
contain it. Up to 6 files of the same package count as open in the editor, and the corpus folder as
the workspace, whose unopened files may give definitions too (as in the server). Without a model
(--no-model) tokens are counted by a word/punctuation proxy.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from pathlib import Path

from memosight.engine.protocol import CompletionRequest, RequestOptions, StopRule

from ..context.languages import LANGUAGES_BY_SUFFIX
from ..context.packing import CONTIGUOUS_NEAR, NEAR_PREFIX_SHARE, ContextCompressor
from ..context.regions import REGION_KINDS, WEIGHTS, analyze, identifiers, without
from ..context.truncation import truncate_around_cursor
from ..context.workspace import WorkspaceIndex
from ..documents import Document, Position
from .common import CommandError, add_json_argument, print_result

FAR_LINES = 30  # an identifier is "far" when it first appears more than this many lines above the cursor
LONG_FILE_LINES = 600  # "where the file is long": truncation at 512 tokens shows a few percent of it
PROXY_TOKEN = re.compile(r"\w+|[^\w\s]+|\s+")
PYTHON_KEYWORDS = frozenset(
    "False None True and as assert async await break class continue def del elif else except finally for "
    "from global if import in is lambda nonlocal not or pass raise return try while with yield self".split())


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
    parser.add_argument("--ablate", type=lambda v: [k for k in v.split(",") if k], default=[],
                        help=f"also pack with each of these region kinds switched off: {','.join(REGION_KINDS)} "
                             "(or all)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="also pack with other weights (regions.WEIGHTS) or near_prefix_share; repeatable")
    parser.add_argument("--model", help="model folder or Hugging Face id (default: the embedded model)")
    parser.add_argument("--device", help="auto, cpu, cuda")
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)


def _budgets(value: str) -> list[int]:
    try:
        budgets = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        budgets = []
    if not budgets or min(budgets) < 16:
        raise argparse.ArgumentTypeError(f"{value!r}: give token budgets of 16 or more, e.g. 512 or 256,512,1024")
    return budgets


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
            engine = load_engine(args.model, device=args.device)
        except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
            raise CommandError(f"{exc} (use --no-model to run without one)") from exc
    count_tokens = engine.count_tokens if engine else (lambda text: len(proxy_tokens(text)))
    encode = engine.encode if engine else proxy_tokens
    if args.suffix_share is None:
        args.suffix_share = 0.0 if engine is not None and engine.status().get("fim_template") == "plain" else 0.25

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
    budgets, args.budget = args.budget, args.budget[0]  # needles and typing: at the first budget
    out = {"corpus": str(corpus), "files": len(files), "suffix_share": args.suffix_share,
           "tokens": "model" if engine else "proxy (--no-model)"}
    per_budget = {}
    for budget in budgets:  # the same cursors at each budget (one seed)
        per_budget[budget] = {"budget": budget,
                              **_recall_and_match(files, args, count_tokens, engine, random.Random(args.seed), budget)}
    out.update(per_budget[budgets[0]])
    if len(budgets) > 1:
        out["budgets"] = {str(b): result for b, result in per_budget.items()}
    out.update(_needles(files, args, count_tokens))
    out.update(_typing(files, args, count_tokens, encode))
    print_result(out, args.json, _table)
    return 0


# --- measurements -------------------------------------------------------------------------------

def _open_files(doc, files, limit: int) -> list:
    """The files a user working on `doc` would have open: its package, those it imports first."""
    folder = doc.path.rsplit("/", 1)[0]
    siblings = [f for f in files if f.uri != doc.uri and f.path.rsplit("/", 1)[0] == folder
                and f.language == doc.language]
    imported = lambda f: f.path.rsplit("/", 1)[1].split(".")[0].lstrip("_") in doc.text[:20000]
    return sorted(siblings, key=lambda f: (not imported(f), f.path))[:limit]


def _is_code(tree, row: int, line: str) -> bool:
    """Whether `line` starts with code, not inside a comment or a string (docstrings are prose)."""
    column = len(line) - len(line.lstrip())
    node = tree.root_node.descendant_for_point_range((row, column), (row, column))
    while node is not None:
        if "comment" in node.type or "string" in node.type:
            return False
        node = node.parent
    return True


def _far_identifiers(lines: list[str], row: int, true_line: str, language: str, other_names: set[str]) -> set[str]:
    first_seen: dict[str, int] = {}
    for i, line in enumerate(lines[:row]):
        for name in identifiers(line):
            first_seen.setdefault(name, i)
    names = identifiers(true_line) - (PYTHON_KEYWORDS if language == "python" else set())
    return {n for n in names if (n in first_seen and first_seen[n] < row - FAR_LINES) or n in other_names}


def _origin_lines(lines: list[str], row: int, names: set[str]) -> dict[str, str]:
    """For each name first seen in this file more than FAR_LINES above `row`: that first line, stripped."""
    out: dict[str, str] = {}
    for i, line in enumerate(lines[:max(0, row - FAR_LINES)]):
        for name in identifiers(line) & names:
            if name not in out and line.strip():
                out[name] = line.strip()
    return out


class Tally:
    """Next-line results of one context kind over a group of cursors: lines exactly right,
    characters of correct prefix, the true line's loss, first-request latency, prompt size."""

    def __init__(self):
        self.n = self.hits = self.chars = self.true_chars = self.tokens = 0
        self.nats = 0.0
        self.ms: list[float] = []
        self.prompt_tokens: list[int] = []

    def add(self, result: dict) -> None:
        self.n += 1
        self.nats += result["nats"]
        self.tokens += result["tokens"]
        self.prompt_tokens.append(result["prompt_tokens"])
        self.true_chars += result["true_chars"]
        if "hit" in result:
            self.hits += result["hit"]
            self.chars += result["chars"]
            self.ms.append(result["ms"])

    def to_json(self) -> dict:
        out = {"positions": self.n, "line_loss": round(self.nats / self.tokens, 4) if self.tokens else None,
               "prompt_tokens_p50": statistics.median(self.prompt_tokens) if self.prompt_tokens else None}
        if self.ms:
            out.update(exact_match=round(self.hits / self.n, 4), exact_lines=self.hits, prefix_chars=self.chars,
                       prefix_chars_share=round(self.chars / self.true_chars, 4) if self.true_chars else None,
                       first_request_ms_p50=round(statistics.median(self.ms), 1))
        return out


def _correct_prefix(generated: str, true_line: str) -> int:
    """Characters of `true_line` (indentation aside) the completion got right before its first error."""
    return _common_prefix(generated.strip(), true_line.strip())


def _next_line(engine, context, true_line: str, generate: bool) -> dict:
    """How well `context` predicts `true_line`: its loss, and (if `generate`) the model's greedy line."""
    nats, tokens = engine.continuation_loss(context.prefix, context.suffix, true_line)
    out = {"nats": nats, "tokens": tokens, "prompt_tokens": context.prompt_tokens,
           "true_chars": len(true_line.strip())}
    if generate:
        # Cold: the latency is a first request's in a file, the whole prompt prefilled.
        completion = engine.stream(CompletionRequest(
            context.prefix, context.suffix, max_new_tokens=48, stop=StopRule(single_line=True),
            options=RequestOptions(cold=True))).result()
        out.update(hit=completion.text.strip() == true_line.strip(), ms=completion.latency_ms,
                   chars=_correct_prefix(completion.text, true_line))
    return out


def _category(true_line: str, far_only: set[str], other_names: set[str], own_names: set[str]) -> str:
    """What the next line uses: a name defined in another file only, a name absent from the 30
    lines above (defined or first used far away in this file), or nothing far."""
    if (identifiers(true_line) & other_names) - own_names:
        return "other_file"
    return "far" if far_only else "near"


def _length_group(lines: int) -> str:
    """Files by length: truncation to 512 tokens shows most of a short file, a few percent of a long one."""
    return "lines<300" if lines < 300 else f"lines300-{LONG_FILE_LINES - 1}" if lines < LONG_FILE_LINES \
        else f"lines{LONG_FILE_LINES}+"


def _variants(args, engine) -> dict[str, ContextCompressor]:
    """The packed contexts to compare: the default, and one per --ablate kind and --variant."""
    compressors = {"compressed": ContextCompressor()}
    asked = {}  # (text hash, row, window) -> what the lines above the row attend to

    def attention(window: int):
        def attended(text: str, row: int):
            key = (hash(text), row, window)
            if key not in asked:
                asked[key] = engine.line_attention(text, [row], window_tokens=window).get(row)
            return asked[key]
        return attended

    for kind in args.ablate:
        compressors[f"compressed_no_{kind}"] = ContextCompressor(weights=without([kind]))
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        weights, share, window, contiguous = dict(WEIGHTS), NEAR_PREFIX_SHARE, 0, CONTIGUOUS_NEAR
        for item in filter(None, settings.split(",")):
            key, _, value = item.partition("=")
            if key == "near_prefix_share":
                share = float(value)
            elif key == "contiguous":  # the near prefix runs on above the cursor's function
                contiguous = value not in ("0", "false", "")
            elif key == "attention":  # the model's own attention as a region score: attention=WINDOW_TOKENS
                if engine is None:
                    raise CommandError(f"--variant {spec!r}: attention needs a model (not --no-model)")
                window = int(value)
            elif key in weights:
                weights[key] = float(value)
            else:
                raise CommandError(f"--variant {spec!r}: unknown key {key!r}; use near_prefix_share, contiguous, attention or "
                                   f"a weight ({', '.join(WEIGHTS)})")
        compressors[name] = ContextCompressor(weights=weights, near_prefix_share=share,
                                              attention=attention(window) if window else None,
                                              contiguous_near=contiguous)
    return compressors


def _recall_and_match(files, args, count_tokens, engine, rng, budget: int) -> dict:
    positions = []
    for doc in files:
        lines = doc.text.split("\n")
        tree = doc.tree
        for row in range(FAR_LINES + 10, len(lines)):
            if len(lines[row].strip()) >= 4 and _is_code(tree, row, lines[row]):
                positions.append((doc, row))
    rng.shuffle(positions)
    positions = positions[:args.max_positions]
    compressors = _variants(args, engine)
    # The corpus stands for the workspace: its unopened files may give definitions, as in the server.
    workspace = WorkspaceIndex(Path(args.corpus))
    workspace.scan()
    found = {"compressed": 0, "truncated": 0}
    found_far = {"compressed": 0, "truncated": 0}  # only those absent from the 30 lines above the cursor
    # The far line where the identifier first appears (its definition, an import, a first use): is
    # that line itself in the context? Seeing the name again near the cursor says nothing of what it is.
    found_origin = {"compressed": 0, "truncated": 0}
    total = total_far = total_origin = 0
    # Next line under each context: exact match, correct prefix, and the true line's loss (nats per
    # token), which moves before a small model's exact match does. Against truncation at the same
    # budget and at twice it (the question is whether compression keeps quality with a smaller
    # prompt); by group: all, what the next line uses (see _category), and the file's length.
    tallies: dict[str, dict[str, Tally]] = {}
    em_done = 0
    for doc, row in positions:
        lines = doc.text.split("\n")
        true_line = lines[row]
        text = "\n".join(lines[:row] + [""] + lines[row + 1:])  # the line is being written
        cursor = sum(len(line) + 1 for line in lines[:row])
        current = Document(doc.uri, text, doc.language)
        others = _open_files(doc, files, args.open_files)
        other_names = set()
        for other in others:
            other_names |= analyze(*other.snapshot(), other.language).symbols.keys()
        targets = _far_identifiers(lines, row, true_line, doc.language, other_names)
        far_only = targets - identifiers("".join(lines[max(0, row - FAR_LINES):row]))
        from_workspace = workspace.documents_for(current, cursor, others)
        packed = {name: compressor.build(current, cursor, budget, args.suffix_share, count_tokens,
                                         others + from_workspace) for name, compressor in compressors.items()}
        packed["truncated"] = truncate_around_cursor(text, cursor, budget, args.suffix_share, count_tokens)
        origins = _origin_lines(lines, row, targets)
        total += len(targets)
        total_far += len(far_only)
        total_origin += len(origins)
        for name in found:
            context = packed[name]
            seen = identifiers(context.prefix) | identifiers(context.suffix)
            found[name] += len(targets & seen)
            found_far[name] += len(far_only & seen)
            shown = {line.strip() for line in (context.prefix + "\n" + context.suffix).split("\n")}
            found_origin[name] += sum(origin in shown for origin in origins.values())
        for name, context in packed.items():
            assert context.prompt_tokens <= budget, (name, context.prompt_tokens)
        if engine is not None and em_done < args.em_positions:
            em_done += 1
            own = set(analyze(*current.snapshot(), current.language).symbols)
            groups = ["all", _category(true_line, far_only, other_names, own), _length_group(len(lines))]
            packed["truncated_2x"] = truncate_around_cursor(text, cursor, 2 * budget, args.suffix_share,
                                                            count_tokens)
            for name, context in packed.items():
                result = _next_line(engine, context, true_line, not args.no_generate)
                for group in groups:
                    tallies.setdefault(group, {}).setdefault(name, Tally()).add(result)
    out = {"positions": len(positions), "far_identifiers": total, **_recall("", found, total),
           "far_only_identifiers": total_far, **_recall("far_only_", found_far, total_far),
           "origin_identifiers": total_origin, **_recall("origin_", found_origin, total_origin)}
    if em_done:
        out["em_positions"] = em_done
        out["next_line"] = {group: {name: tally.to_json() for name, tally in by_name.items()}
                            for group, by_name in tallies.items()}
        for name, tally in tallies["all"].items():  # the headline figures, flat
            for key, value in tally.to_json().items():
                if key != "positions":
                    out[f"{key}_{name}"] = value
    return out


def _recall(prefix: str, found: dict[str, int], total: int) -> dict:
    """`{prefix}recall_compressed` / `_truncated` (shares of `total`) and their ratio."""
    out = {f"{prefix}recall_{name}": round(found[name] / total, 4) if total else None for name in found}
    out[f"{prefix}recall_ratio"] = round(found["compressed"] / found["truncated"], 3) if found["truncated"] else None
    return out


NEEDLE_CONSTANT = "MEMOSIGHT_NEEDLE_LIMIT = 7919  # the needle\n"
NEEDLE_HELPER = "def memosight_needle_helper(count, scale=3):\n    return count * scale + 7919\n"


def _needles(files, args, count_tokens) -> dict:
    """Python needles: a constant at the top of a file grown to thousands of lines, used at the end;
    and a helper defined in another open file, used at the cursor."""
    pythons = [f for f in files if f.language == "python"]
    compressor = ContextCompressor()
    cases = found = 0
    for doc in pythons[:6]:
        body = doc.text
        while body.count("\n") < 3000:
            body += "\n\n" + doc.text
        user = ("\n\ndef memosight_needle_user(items):\n    total = 0\n    for item in items:\n"
                "        total += item\n    limit = MEMOSIGHT_NEEDLE_LIMIT\n    ")
        text = NEEDLE_CONSTANT + body + user
        current = Document(doc.uri, text, "python")
        packed = compressor.build(current, len(text), args.budget, args.suffix_share, count_tokens, [])
        cases += 1
        found += "7919" in packed.prefix + packed.suffix
        half = doc.text.find("\ndef ", len(doc.text) // 2)  # a top-level boundary, so the file parses
        half = len(doc.text) if half < 0 else half
        helper_file = Document(doc.uri.rsplit("/", 1)[0] + "/memosight_needle.py",
                               doc.text[:half] + "\n\n" + NEEDLE_HELPER, "python")
        user = "\n\ndef memosight_needle_user(items):\n    n = memosight_needle_helper(len(items))\n    "
        text = doc.text + user
        current = Document(doc.uri, text, "python")
        packed = compressor.build(current, len(text), args.budget, args.suffix_share, count_tokens,
                                  [helper_file, *_open_files(doc, files, args.open_files - 1)])
        cases += 1
        found += "def memosight_needle_helper(count, scale=3)" in packed.prefix
    return {"needle_cases": cases, "needle_found": found}


def _typing(files, args, count_tokens, encode) -> dict:
    """Type lines of a 2,000-line file char by char; stability of the prompt prefix and build time."""
    source = max((f for f in files if f.language == "python"), key=lambda f: f.text.count("\n"), default=None)
    if source is None:
        return {}
    lines = source.text.split("\n")[:2000]
    rng = random.Random(args.seed + 1)
    rows = [r for r in range(200, len(lines) - 1)
            if lines[r].startswith("        ") and len(lines[r].strip()) > 20]
    rows = sorted(rng.sample(rows, min(6, len(rows))))
    compressor = ContextCompressor()
    shared = {"compressed": [], "truncated": []}
    times = []
    for row in rows:
        text = "\n".join(lines[:row] + [lines[row][:len(lines[row]) - len(lines[row].lstrip())]] + lines[row + 1:])
        doc = Document(source.uri, text, "python")
        indent = len(lines[row]) - len(lines[row].lstrip())
        compressor.build(doc, doc.offset_at(Position(row, indent)), args.budget, args.suffix_share, count_tokens)
        previous = {}
        for i, ch in enumerate(lines[row].lstrip()):
            doc.apply_change(ch, Position(row, indent + i), Position(row, indent + i))
            cursor = doc.offset_at(Position(row, indent + i + 1))
            start = time.perf_counter()
            compressed = compressor.build(doc, cursor, args.budget, args.suffix_share, count_tokens)
            times.append((time.perf_counter() - start) * 1000)
            truncated = truncate_around_cursor(doc.text, cursor, args.budget, args.suffix_share, count_tokens)
            for name, context in (("compressed", compressed), ("truncated", truncated)):
                ids = list(encode(context.prefix))
                if name in previous and ids:
                    shared[name].append(_common_prefix(previous[name], ids) / len(ids))
                previous[name] = ids
    if not times:
        return {}
    times.sort()
    pick = lambda q: round(times[min(len(times) - 1, int(len(times) * q))], 3)
    return {"typing_keystrokes": len(times), "file_lines": len(lines),
            "stability_compressed": round(statistics.mean(shared["compressed"] or [0]), 4),
            "stability_truncated": round(statistics.mean(shared["truncated"] or [0]), 4),
            "build_ms_p50": pick(0.5), "build_ms_p95": pick(0.95)}


def _common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


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
             f"{out.get('file_lines')}-line file")]
    lines.append(f"{'':<36} {'compressed':>12} {'truncated':>12}   note")
    lines.extend(f"{name:<36} {a:>12} {b:>12}   {note}" for name, a, b, note in rows)
    lines.append(f"({out['positions']} cursor positions at code lines; {out['far_identifiers']} far identifiers, "
                 f"{out['far_only_identifiers']} of them absent from the 30 lines above)")
    lines.append("* the recall the 1.5x target is read against (see memosight bench context --help)")
    for budget, result in (out.get("budgets") or {str(out["budget"]): out}).items():
        if "next_line" not in result:
            continue
        lines.append(f"\nnext line at budget {budget} (truncated_2x: plain truncation at {2 * int(budget)} tokens)")
        lines.append(f"{'cursors':<18} {'context':<32} {'exact':>7} {'prefix chars':>13} {'loss':>7} "
                     f"{'first ms p50':>12} {'prompt':>7}")
        for group, by_name in result["next_line"].items():
            for i, (name, t) in enumerate(by_name.items()):
                label = f"{group} ({t['positions']})" if i == 0 else ""
                exact = f"{t['exact_lines']}/{t['positions']}" if "exact_lines" in t else "-"
                lines.append(f"{label:<18} {name:<32} {exact:>7} {fmt(t.get('prefix_chars')):>13} "
                             f"{fmt(t['line_loss']):>7} {fmt(t.get('first_request_ms_p50')):>12} "
                             f"{fmt(t['prompt_tokens_p50']):>7}")
    lines.append("(cursors: by what the next line uses: far = a name absent from the 30 lines above, other_file = "
                 "a name only another file defines, near = neither; and by the length of the file)")
    return "\n".join(lines)
