"""The measurements of `memosight bench context` (bench_context.py): identifier recall, the next
line under each context, needles, prefix stability and build time while typing."""

from __future__ import annotations

import json
import random
import re
import statistics
import time
from os.path import commonprefix  # of any two sequences: text, token ids
from pathlib import Path

from memosight.engine.protocol import CompletionRequest, RequestOptions, StopRule

from ..context.packing import CONTIGUOUS_NEAR, NEAR_PREFIX_SHARE, ContextCompressor, bounded_share
from ..context.regions import WEIGHTS, analyze, identifiers, without
from ..context.truncation import truncate_around_cursor
from ..context.window import chunk_of, window, window_with_chunks
from ..context.workspace import WorkspaceIndex
from ..documents import Document, Position
from ..commands.common import CommandError

FAR_LINES = 30  # an identifier is "far" when it first appears more than this many lines above the cursor
LONG_FILE_LINES = 600  # "where the file is long": truncation at 512 tokens shows a few percent of it
PROXY_TOKEN = re.compile(r"\w+|[^\w\s]+|\s+")
PYTHON_KEYWORDS = frozenset(
    "False None True and as assert async await break class continue def del elif else except finally for "
    "from global if import in is lambda nonlocal not or pass raise return try while with yield self".split())


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


def project_root(corpus: Path, path: Path) -> Path:
    """The project a file of the corpus belongs to, which is its workspace: the corpus's top-level
    folder holding it (a corpus of several projects, attrs/ click/ requests/, is not one workspace:
    no editor has a workspace that spans unrelated projects), or the corpus for a file at its top."""
    corpus = corpus.resolve()
    try:
        parts = path.resolve().relative_to(corpus).parts
    except ValueError:  # a link to a file outside the corpus
        return corpus
    return corpus / parts[0] if len(parts) > 1 else corpus


class Tally:
    """Next-line results of one context kind over a group of cursors: lines exactly right,
    characters of correct prefix, the true line's loss, first-request latency, prompt size."""

    def __init__(self):
        self.n = self.hits = self.chars = self.true_chars = self.tokens = 0
        self.nats = 0.0
        self.ms: list[float] = []  # the whole line, cold
        self.first_token_ms: list[float] = []
        self.prompt_tokens: list[int] = []
        self.losses: list[tuple[str, float, int]] = []  # per cursor (file, nats, tokens), for paired comparisons

    def add(self, result: dict) -> None:
        self.n += 1
        self.losses.append((result.get("file", ""), result["nats"], result["tokens"]))
        self.nats += result["nats"]
        self.tokens += result["tokens"]
        self.prompt_tokens.append(result["prompt_tokens"])
        self.true_chars += result["true_chars"]
        if "hit" in result:
            self.hits += result["hit"]
            self.chars += result["chars"]
            self.ms.append(result["ms"])
            self.first_token_ms.append(result["first_token_ms"])

    def to_json(self) -> dict:
        out = {"positions": self.n, "line_loss": round(self.nats / self.tokens, 4) if self.tokens else None,
               "prompt_tokens_p50": statistics.median(self.prompt_tokens) if self.prompt_tokens else None}
        if self.ms:
            out.update(exact_match=round(self.hits / self.n, 4), exact_lines=self.hits, prefix_chars=self.chars,
                       prefix_chars_share=round(self.chars / self.true_chars, 4) if self.true_chars else None,
                       first_request_ms_p50=round(statistics.median(self.ms), 1),
                       first_token_ms_p50=round(statistics.median(self.first_token_ms), 1))
        return out


def paired_loss_difference(base: Tally, other: Tally, resamples: int = 2000, seed: int = 0) -> dict:
    """`other`'s loss minus `base`'s over the same cursors (nats per token, negative: `other` is
    better), with a 95% interval from resampling the files the cursors are in (cursors of one file
    are alike, so resampling them one by one would claim too narrow an interval): whether a
    difference is more than which files and cursors happened to be drawn."""
    by_file: dict[str, list[float]] = {}  # file -> [extra nats of `other`, tokens]
    for (path, base_nats, tokens), (other_path, other_nats, _) in zip(base.losses, other.losses, strict=True):
        assert path == other_path, "the two tallies must hold the same cursors"
        extra = by_file.setdefault(path, [0.0, 0])
        extra[0] += other_nats - base_nats
        extra[1] += tokens
    files = list(by_file.values())
    if not files:
        return {}

    def difference(sample) -> float:
        return sum(n for n, _ in sample) / (sum(t for _, t in sample) or 1)

    rng = random.Random(seed)
    spread = sorted(difference([rng.choice(files) for _ in files]) for _ in range(resamples))
    return {"loss_minus_packed": round(difference(files), 4),
            "ci95": [round(spread[int(0.025 * resamples)], 4), round(spread[int(0.975 * resamples) - 1], 4)]}


def _correct_prefix(generated: str, true_line: str) -> int:
    """Characters of `true_line` (indentation aside) the completion got right before its first error."""
    return len(commonprefix([generated.strip(), true_line.strip()]))


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
                   first_token_ms=completion.first_token_ms,
                   chars=_correct_prefix(completion.text, true_line), text=completion.text)
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


def _variants(args, engine, budget: int) -> tuple[dict[str, ContextCompressor], dict[str, float]]:
    """The packed contexts to compare: the default, and one per --ablate kind and --variant; and
    the suffix share of those whose variant sets its own (suffix_tokens: the server's bound, as a
    share of this budget)."""
    compressors = {"compressed": ContextCompressor()}
    shares = {}
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
            elif key == "suffix_share":  # of the budget, after the cursor (--suffix-share for all)
                shares[name] = float(value)
            elif key == "suffix_tokens":  # at most this many tokens after the cursor, as the server bounds it
                shares[name] = bounded_share(shares.get(name, args.suffix_share), int(value), budget)
            elif key == "contiguous":  # the near prefix runs on above the cursor's function
                contiguous = value.strip().lower() not in ("0", "false", "no", "off", "")
            elif key == "attention":  # the model's own attention as a region score: attention=WINDOW_TOKENS
                if engine is None:
                    raise CommandError(f"--variant {spec!r}: attention needs a model (not --no-model)")
                window = int(value)
            elif key in weights:
                weights[key] = float(value)
            else:
                raise CommandError(f"--variant {spec!r}: unknown key {key!r}; use near_prefix_share, suffix_share, "
                                   "suffix_tokens, contiguous, "
                                   "attention or "
                                   f"a weight ({', '.join(WEIGHTS)})")
        compressors[name] = ContextCompressor(weights=weights, near_prefix_share=share,
                                              attention=attention(window) if window else None,
                                              contiguous_near=contiguous)
    return compressors, shares


def code_positions(files, rng) -> list[tuple[Document, int]]:
    """(document, row) of every code line far enough down its file to have far context, shuffled."""
    positions = []
    for doc in files:
        lines = doc.text.split("\n")
        tree = doc.tree
        for row in range(FAR_LINES + 10, len(lines)):
            if len(lines[row].strip()) >= 4 and _is_code(tree, row, lines[row]):
                positions.append((doc, row))
    rng.shuffle(positions)
    return positions


def line_being_written(doc: Document, row: int) -> tuple[str, Document, int]:
    """The true line at `row`, the document without it (the user is writing it) and the cursor there."""
    lines = doc.text.split("\n")
    text = "\n".join(lines[:row] + [""] + lines[row + 1:])
    return lines[row], Document(doc.uri, text, doc.language), sum(len(line) + 1 for line in lines[:row])


def recall_and_match(files, args, count_tokens, engine, rng, budget: int) -> dict:
    positions = code_positions(files, rng)[:args.max_positions]
    compressors, shares = _variants(args, engine, budget)
    # The project stands for the workspace: its unopened files may give definitions, as in the server.
    workspaces: dict[Path, WorkspaceIndex] = {}
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
        true_line, current, cursor = line_being_written(doc, row)
        text = current.text
        others = _open_files(doc, files, args.open_files)
        # Where the user was in each open file (one row drawn per file): llama.vim's ring holds the
        # chunk around it, the packer gets it as the file's last edit (recent_code).
        seen_rows = [rng.randrange(max(1, o.text.count("\n"))) for o in others]
        for other, row_seen in zip(others, seen_rows):
            other.recent_rows = (row_seen,)
        other_names = set()
        for other in others:
            other_names |= analyze(*other.snapshot(), other.language).symbols.keys()
        targets = _far_identifiers(lines, row, true_line, doc.language, other_names)
        far_only = targets - identifiers("".join(lines[max(0, row - FAR_LINES):row]))
        root = project_root(Path(args.corpus), Path(doc.path))
        if root not in workspaces:
            workspaces[root] = WorkspaceIndex(root)
            workspaces[root].scan()
        from_workspace = workspaces[root].documents_for(current, cursor, others)
        packed = {name: compressor.build(current, cursor, budget, shares.get(name, args.suffix_share), count_tokens,
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
            fim = args.suffix_share > 0
            packed["window"] = window(text, cursor, budget, count_tokens, fim, doc.path)
            packed["window_2x"] = window(text, cursor, 2 * budget, count_tokens, fim, doc.path)
            # the same token count as the packed context's prompt, which leaves room to type into
            packed["window_same"] = window(text, cursor, packed["compressed"].prompt_tokens, count_tokens, fim,
                                           doc.path)
            # llama.vim's ring: chunks of code the user saw in the other open files, where they were
            chunks = [(o.path, chunk_of(o.text, row_seen)) for o, row_seen in zip(others, seen_rows)]
            packed["window_chunks"] = window_with_chunks(text, cursor, budget, count_tokens, fim, chunks,
                                                         "#" if doc.language == "python" else "//", doc.path)
            wanted = set(args.contexts) | {name for name in compressors}
            line = {"file": doc.path, "row": row, "budget": budget, "groups": groups}
            for name, context in packed.items():
                if name not in wanted:
                    continue
                result = {"file": doc.path, **_next_line(engine, context, true_line, not args.no_generate)}
                line[name] = result
                for group in groups:
                    tallies.setdefault(group, {}).setdefault(name, Tally()).add(result)
            if args.cursors_out:  # emptied at the start of the run (bench_context.run)
                with open(args.cursors_out, "a", encoding="utf-8") as out_file:
                    out_file.write(json.dumps(line) + "\n")
    for doc in files:  # the rows drawn above stand for one cursor's editor, not the next test's
        doc.recent_rows = ()
    out = {"positions": len(positions), "far_identifiers": total, **_recall("", found, total),
           "far_only_identifiers": total_far, **_recall("far_only_", found_far, total_far),
           "origin_identifiers": total_origin, **_recall("origin_", found_origin, total_origin)}
    if em_done:
        out["em_positions"] = em_done
        out["next_line"] = {group: {name: {**tally.to_json(), **(paired_loss_difference(by_name["compressed"], tally)
                                                                if name != "compressed" else {})}
                                    for name, tally in by_name.items()}
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


def needle_figures(files, args, count_tokens) -> dict:
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


def typing_stability(files, args, count_tokens, encode) -> dict:
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
    times, cold = [], []  # per keystroke; the first build in a file just opened (parsed and analysed then)
    for row in rows:
        text = "\n".join(lines[:row] + [lines[row][:len(lines[row]) - len(lines[row].lstrip())]] + lines[row + 1:])
        doc = Document(source.uri, text, "python")
        indent = len(lines[row]) - len(lines[row].lstrip())
        start = time.perf_counter()
        compressor.build(doc, doc.offset_at(Position(row, indent)), args.budget, args.suffix_share, count_tokens)
        cold.append((time.perf_counter() - start) * 1000)
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
                    shared[name].append(len(commonprefix([previous[name], ids])) / len(ids))
                previous[name] = ids
    if not times:
        return {}
    times.sort()
    pick = lambda q: round(times[min(len(times) - 1, int(len(times) * q))], 3)
    return {"typing_keystrokes": len(times), "file_lines": len(lines),
            "stability_compressed": round(statistics.mean(shared["compressed"] or [0]), 4),
            "stability_truncated": round(statistics.mean(shared["truncated"] or [0]), 4),
            "build_ms_p50": pick(0.5), "build_ms_p95": pick(0.95),
            "build_cold_ms_p50": round(statistics.median(cold), 3), "build_cold_ms_max": round(max(cold), 3)}


