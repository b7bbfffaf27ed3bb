"""`memosight bench speculative --corpus DIR [--json]`: speculative decoding against plain greedy.

Side by side in one run, same model, dtype and device, prompts cut from real source files:
transformers `generate` greedy (the baseline), transformers prompt-lookup decoding, our plain loop,
and our speculative loop with each draft source alone and all combined. Methods take turns on every
prompt, so machine noise falls on all of them alike; each speculative method keeps its draft
controller from prompt to prompt, as the engine does from request to request.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of source files (held-out code)")
    parser.add_argument("--model", help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda")
    parser.add_argument("--dtype", default="float32", help="float32 (exact) | bfloat16 | float16")
    parser.add_argument("--prompts", type=int, default=24, help="number of cursor positions")
    parser.add_argument("--min-new", type=int, default=32)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=4000, help="text before the cursor in the prompt")
    parser.add_argument("--methods", default="all", help="comma list, or 'all'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")


METHODS = ("hf_greedy", "hf_prompt_lookup", "plain", "spec_heads", "spec_ngram", "spec_lookahead", "spec_all")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..decode import DraftController, SpecStats
    from ..loading import ModelLoadError, load_engine
    from .common import cut_points, source_files, table

    try:
        engine = load_engine(args.model, device=args.device, dtype=args.dtype)
    except ModelLoadError as exc:
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    methods = METHODS if args.methods == "all" else tuple(m.strip() for m in args.methods.split(","))
    if engine.heads is None:
        methods = tuple(m for m in methods if m != "spec_heads")
    rng = random.Random(args.seed)
    prompts = []
    files = source_files(args.corpus)
    rng.shuffle(files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for cut in cut_points(text, 2, rng):
            prefix, suffix = text[max(0, cut - args.prompt_chars):cut], text[cut:cut + 1000]
            prompts.append((engine.prompt_ids(prefix, suffix), rng.randint(args.min_new, args.max_new)))
        if len(prompts) >= args.prompts:
            break
    prompts = prompts[: args.prompts]
    model, eos = engine.model, sorted(engine.eos_ids)
    all_drafters = {"heads": engine.heads_drafter, "ngram": next(d for d in engine.drafters if d.name == "ngram"),
                    "lookahead": engine.lookahead}

    def hf(ids, n, **kw):
        out = model.generate(torch.tensor([ids], device=engine.device), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **kw)
        return out[0, len(ids):].tolist()

    results = {m: {"seconds": 0.0, "tokens": 0, "match": 0, "stats": SpecStats()} for m in methods}
    # One draft controller per method for the whole run, as the engine keeps one across requests:
    # what it learns about the sources (which pay, which cost more time than they save) carries over.
    controllers = {m: DraftController() for m in methods}
    reference: list[list[int]] = []
    for i, (ids, n) in enumerate(prompts):
        reference.append(hf(ids, n))  # also warms up this prompt length
        order = list(methods)
        rng.shuffle(order)
        for method in order:
            engine.prompt_cache.clear()  # no reuse between methods: each prefills the whole prompt
            stats = results[method]["stats"]
            start = time.perf_counter()
            if method == "hf_greedy":
                out = hf(ids, n)
            elif method == "hf_prompt_lookup":
                out = hf(ids, n, prompt_lookup_num_tokens=10)
            elif method == "plain":
                out = engine.generate(ids, n, speculative=False)
            else:
                names = ["heads", "ngram", "lookahead"] if method == "spec_all" else [method.split("_", 1)[1]]
                engine.drafters = [all_drafters[k] for k in names if all_drafters[k] is not None]
                engine.spec_stats, engine.controller = stats, controllers[method]
                out = engine.generate(ids, n, speculative=True)
            results[method]["seconds"] += time.perf_counter() - start
            results[method]["tokens"] += len(out)
            results[method]["match"] += int(out == reference[i])
        print(f"\rprompt {i + 1}/{len(prompts)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    base_tps = results["hf_greedy"]["tokens"] / results["hf_greedy"]["seconds"] if "hf_greedy" in results else None
    rows = []
    for method in methods:
        r = results[method]
        tps = r["tokens"] / r["seconds"] if r["seconds"] else 0.0
        s = r["stats"].to_json() if method.startswith("spec") else None
        rows.append({
            "method": method, "tokens_per_s": round(tps, 1),
            "speedup": round(tps / base_tps, 3) if base_tps else None,
            "tokens_per_step": s["tokens_per_step"] if s else None,
            "exact_match": round(r["match"] / len(prompts), 4),
            "sources": s["sources"] if s else None, "head_accuracy": s["head_accuracy"] if s else None,
        })
    reuse = _keystroke_reuse(engine, files[0], 1500)
    peak_mb = (torch.cuda.max_memory_allocated() / 2**20 if engine.device.type == "cuda"
               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    summary = {"model": engine.name, "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
               "threads": torch.get_num_threads(), "prompts": len(prompts),
               "new_tokens": [args.min_new, args.max_new], "methods": rows, "keystroke_reuse": reuse,
               "peak_memory_mb": round(peak_mb, 1)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"model {summary['model']}  device {summary['device']}  dtype {summary['dtype']}  threads "
          f"{summary['threads']}  prompts {len(prompts)}  new tokens {args.min_new}-{args.max_new}")
    print(table(rows, [("method", "method"), ("tokens_per_s", "tok/s"), ("speedup", "speedup"),
                       ("tokens_per_step", "tok/step"), ("exact_match", "= greedy")]))
    for row in rows:
        if row["sources"]:
            acc = ", ".join(f"{k} {v['accepted']}/{v['drafted']}" for k, v in row["sources"].items())
            heads = " ".join(f"{a:.2f}" for a in row["head_accuracy"] or [])
            print(f"  {row['method']}: accepted/drafted nodes: {acc}" + (f"; head top-1: {heads}" if heads else ""))
    print(f"keystroke on a {reuse['prompt_tokens']}-token prompt: prefilled {reuse['prefilled_tokens']} tokens "
          f"({reuse['reused_tokens']} reused)")
    print(f"peak memory: {summary['peak_memory_mb']} MB")
    return 0


def _keystroke_reuse(engine, path, prompt_tokens: int) -> dict:
    """Prefill a ~`prompt_tokens` prompt, then the same prompt with one more character typed."""
    text = path.read_text(encoding="utf-8", errors="replace")
    ids = engine.encode(text)[:prompt_tokens]
    prefix = engine.decode(ids)
    engine.prompt_cache.clear()
    engine.generate(engine.prompt_ids(prefix), 4)
    before = engine.prompt_cache.reused_tokens
    typed = engine.prompt_ids(prefix + "x")
    engine.generate(typed, 4)
    reused = engine.prompt_cache.reused_tokens - before
    return {"prompt_tokens": len(typed), "reused_tokens": reused, "prefilled_tokens": len(typed) - reused}
