"""Speculative decoding against plain greedy, side by side (`memosight bench speculative`).

Same model, dtype and device, prompts cut from real source files: transformers `generate` greedy
(the baseline), transformers prompt-lookup decoding, our plain loop, and our speculative loop with
each draft source alone and all combined. Methods take turns on every prompt, so machine noise
falls on all of them alike; each speculative method keeps its own speculator (sources, draft
controller, statistics) from prompt to prompt, as the engine does from request to request.

Each method first prefills all but the last prompt token into its own cache (transformers' forward
and DynamicCache for the transformers methods), timed apart from decoding. The main figures are
decoding from that cache, which is what speculation changes and what a keystroke costs once the KV
cache is reused; the figures with prefill add each method's prefill time (a cold prompt).
transformers' prompt-lookup decoding goes wrong when handed a prefilled cache (its output stops
matching greedy), so it runs from the bare prompt and its decoding time is its total time less
transformers' prefill of the same prompt, measured just before it.

For a model loaded from a GGUF file (or with `gguf=` given), llama.cpp runs on that very file with
the same thread count, on the same token ids, prefilled the same way: in-process through
llama-cpp-python (bench/llamacpp.py; labelled with the build flags its wheel reports), plain greedy
(llama_greedy) and with its own prompt-lookup drafts (llama_prompt_lookup); and, where it is built
(build_llama_cpp.sh), llama.cpp's own llama-server compiled natively for this CPU
(bench/llama_server.py): llama_server, the fair baseline that `vs llama.cpp` divides by, and
llama_server_ngram_mod / llama_server_ngram_simple, the same server speculating by itself
(`--spec-type`), the best a user could run instead.

An engine on the llama.cpp runtime (runtime/llamacpp.py: `engine.model` is None) runs our plain
loop and the speculative ones there; the transformers methods sit out, and the reference for "exact"
is its own plain greedy decoding. Its `generate` starts from a fresh cache (so that the same ids give
the same tokens), so its prefill is the one `generate` does, timed by the runtime and taken off.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..decoding import kv
from ..decoding.speculate import Speculator
from ..drafts import SOURCES
from ..drafts.model import DraftModel
from ..engines.local import LocalEngine
from .common import cut_points, source_files, table
from .llama_server import LlamaServerDecoder, native_bin_dir
from .llamacpp import LlamaCppDecoder, build_flags, gguf_of

# transformers' two greedy decoders, our plain loop, each draft source alone, and all of them.
# spec_draft_model and hf_assisted (transformers' assisted generation with the same draft) run when
# the engine was loaded with a draft model.
# spec_draft_ngram: the draft model with the n-gram drafts, the pair the issue of draft models asks for.
COMBOS = {"spec_draft_ngram": (DraftModel.name, "ngram")}
# llama-server's own speculation (--spec-type), as a user would start it
SERVER_SPEC = {"llama_server_ngram_mod": "ngram-mod", "llama_server_ngram_simple": "ngram-simple"}
LLAMA_METHODS = ("llama_greedy", "llama_prompt_lookup", "llama_server", *SERVER_SPEC)
# hf_static: transformers' own fast path on a GPU (a static cache, its decoding step compiled by
# torch.compile as generate does by itself for a static cache), beside hf_greedy. CUDA only.
METHODS = ("hf_greedy", "hf_static", "hf_prompt_lookup", "hf_assisted", *LLAMA_METHODS, "plain",
           *(f"spec_{source.name}" for source in SOURCES), f"spec_{DraftModel.name}", *COMBOS, "spec_all")


def _names(method: str) -> tuple[str, ...]:
    """The draft sources a spec_ method uses ("*": all)."""
    return ("*",) if method == "spec_all" else COMBOS.get(method, (method.removeprefix("spec_"),))


def run_speculative(engine: LocalEngine, corpus: str | Path, *, prompts: int = 24, min_new: int = 32,
                    max_new: int = 128, prompt_chars: int = 4000, prompt_tokens: int = 0,
                    methods: tuple[str, ...] = METHODS, seed: int = 0, gguf: str | Path | None = None,
                    threads: int = 0, progress: Callable[[int, int], None] = lambda done, total: None) -> dict:
    """Every method on the same prompts; the summary `memosight bench speculative --json` prints.
    `prompt_tokens`: cut each prompt to at most this many tokens (the text nearest the cursor kept).
    `threads`: the thread count of every method (0: the engine's own choice)."""
    on_llamacpp = engine.model is None  # the engine runs on the llama.cpp runtime
    if on_llamacpp:
        threads = engine.runtime.threads  # fixed at load (MEMOSIGHT_THREADS)
    elif threads:
        torch.set_num_threads(threads)
        engine.prompt_cache.prefill_threads = None  # the same count for prefills too: core for core
    threads = threads if on_llamacpp else torch.get_num_threads()
    available = {d.name for d in engine.speculator.drafters}
    draft = engine.speculator.drafter(DraftModel.name)
    gguf = Path(gguf) if gguf else (engine.runtime.path if on_llamacpp else gguf_of(engine.model_dir))
    servers = {"llama_server", *SERVER_SPEC}
    bin_dir = native_bin_dir() if servers & set(methods) and gguf is not None and engine.device.type == "cpu" \
        else None
    methods = tuple(m for m in methods if (not m.startswith("spec_") or m == "spec_all"
                                           or set(_names(m)) <= available)
                    and (m != "hf_assisted" or draft is not None)
                    and (not m.startswith("hf_") or not on_llamacpp)
                    and (m != "hf_static" or engine.device.type == "cuda")
                    and (m not in LLAMA_METHODS or (gguf is not None and engine.device.type == "cpu"))
                    and (m not in servers or bin_dir is not None))
    # Every llama.cpp baseline is closed however the run ends (an error, Ctrl-C, SIGTERM as SystemExit):
    # each may be a llama-server process of its own.
    llama: dict = {}
    try:
        for m in methods:
            if m in LLAMA_METHODS:
                llama[m] = (LlamaServerDecoder(gguf, threads, bin_dir, SERVER_SPEC.get(m)) if m in servers
                            else LlamaCppDecoder(gguf, threads, prompt_lookup=m == "llama_prompt_lookup"))
        rng = random.Random(seed)
        cases = []
        files = source_files(corpus)
        rng.shuffle(files)
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            for cut in cut_points(text, 2, rng):
                cases.append((_prompt(engine, text, cut, prompt_chars, prompt_tokens), rng.randint(min_new, max_new)))
            if len(cases) >= prompts:
                break
        cases = cases[:prompts]
        model, eos = engine.model, sorted(engine.eos_ids)

        def hf(ids, n, **kw):
            out = model.generate(torch.tensor([ids], device=engine.device), max_new_tokens=n, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0], **kw)
            return out[0, len(ids):].tolist()

        def sync() -> None:
            if engine.device.type == "cuda":
                torch.cuda.synchronize()

        @torch.inference_mode()
        def prefill(method, ids) -> dict:
            """All but the last prompt token into the method's cache: what a keystroke finds cached."""
            if method.startswith("hf_"):
                return kv.transformers_prefill(model, ids[:-1])
            if method in llama:
                llama[method].prefill(ids[:-1])
                return {}
            if on_llamacpp:  # its generate() prefills from a fresh cache itself (timed, and taken off below)
                return {}
            engine.prompt_cache.clear()
            engine.runtime.prefill_hidden(ids[:-1])
            for source in speculators[method].drafters if method in speculators else []:
                if isinstance(source, DraftModel):  # the draft's cache too, as a keystroke finds it
                    source.warm(ids[:-1])
            return {}

        results = {m: {"seconds": 0.0, "prefill_seconds": 0.0, "tokens": 0, "match": 0, "plain_match": 0,
                       "differences": []} for m in methods}
        # One speculator per method for the whole run, as the engine keeps one across requests: what its
        # controller learns about the sources (which pay, which cost more time than they save) carries
        # over. Each has sources of its own, so that no method's figures or learning leak into another's.
        def sources(method: str) -> list:
            return [d.fresh() for d in engine.speculator.drafters if "*" in _names(method) or d.name in _names(method)]

        speculators = {m: Speculator(sources(m), max_rows=getattr(engine.runtime, "exact_rows", None))
                       for m in methods if m.startswith("spec_")}
        if "hf_static" in methods and cases:  # torch.compile's first calls compile (a minute): not timed
            for _ in range(2):
                hf(cases[0][0], 8, cache_implementation="static")
        reference: list[list[int]] = []
        for i, (ids, n) in enumerate(cases):
            # Our own greedy loop: what "lossless" means where transformers' greedy is not one answer
            # (int8: its output depends on how the prompt was split into forward passes).
            plain = engine.generate(ids, n, speculative=False)
            reference.append(plain if on_llamacpp else hf(ids, n))  # also warms up this prompt length
            order = list(methods)
            rng.shuffle(order)
            for method in order:
                sync()
                start = time.perf_counter()
                cached = prefill(method, ids)
                sync()  # GPU work is asynchronous: the clock must wait for it
                decoding = time.perf_counter()
                if method == "hf_greedy":
                    out = hf(ids, n, **cached)
                elif method == "hf_static":  # from the bare prompt (its own cache), the prefill taken off below
                    out = hf(ids, n, cache_implementation="static")
                elif method == "hf_prompt_lookup":
                    # Its candidate generator goes wrong on a prefilled cache (the output stops matching
                    # greedy), so it runs from the bare prompt, and its own prefill is taken off below.
                    out = hf(ids, n, prompt_lookup_num_tokens=10)
                elif method == "hf_assisted":  # the same: from the bare prompt, the prefill taken off
                    out = hf(ids, n, assistant_model=draft.model)
                elif method in llama:
                    out = llama[method].generate(ids, n, engine.eos_ids)
                elif method == "plain":
                    out = engine.generate(ids, n, speculative=False)
                else:
                    engine.speculator = speculators[method]
                    out = engine.generate(ids, n, speculative=True)
                sync()
                prefill_seconds = decoding - start
                decode_seconds = time.perf_counter() - decoding
                if method in ("hf_static", "hf_prompt_lookup", "hf_assisted"):  # the same prefill happened inside generate
                    decode_seconds = max(decode_seconds - prefill_seconds, 1e-9)
                elif on_llamacpp and method not in llama:  # the prefill generate() did, as the runtime timed it
                    prefill_seconds = (engine.runtime.last_lookup_ms + engine.runtime.last_prefill_ms) / 1000
                    decode_seconds = max(decode_seconds - prefill_seconds, 1e-9)
                results[method]["seconds"] += decode_seconds
                results[method]["prefill_seconds"] += prefill_seconds
                results[method]["tokens"] += len(out)
                results[method]["match"] += int(out == reference[i])
                results[method]["plain_match"] += int(out == plain)
                if out != plain and method != "plain":
                    results[method]["differences"].append(first_difference(engine, ids, plain, out, i))
            progress(i + 1, len(cases))

        def rate(r, with_prefill=False):
            seconds = r["seconds"] + (r["prefill_seconds"] if with_prefill else 0.0)
            return r["tokens"] / seconds if seconds else 0.0

        base = results.get("hf_greedy") or results.get("plain")
        cpp = results.get("llama_server") or results.get("llama_greedy")  # native where built
        rows = []
        for method in methods:
            r = results[method]
            s = speculators[method].to_json() if method in speculators else None
            rows.append({
                "method": method, "tokens_per_s": round(rate(r), 1),
                "speedup": round(rate(r) / rate(base), 3) if base else None,
                "tokens_per_s_with_prefill": round(rate(r, True), 1),
                "speedup_with_prefill": round(rate(r, True) / rate(base, True), 3) if base else None,
                "vs_llama_cpp": round(rate(r) / rate(cpp), 3) if cpp else None,
                "vs_llama_cpp_with_prefill": round(rate(r, True) / rate(cpp, True), 3) if cpp else None,
                "tokens_per_step": s["tokens_per_step"] if s else None,
                "exact_match": round(r["match"] / len(cases), 4),
                "plain_match": round(r["plain_match"] / len(cases), 4),
                "sources": s["sources"] if s else None, "head_accuracy": s.get("head_accuracy") if s else None,
                "differences": r["differences"],
            })
        engine.speculator = speculators.get("spec_all", engine.speculator)
        plain = results.get("plain")
        step_floor = None
        if plain and plain["tokens"] and engine.device.type == "cpu" and engine.model is not None:
            from ..runtime.lean import decoder_for
            from .floor import floor

            lean = decoder_for(engine.model)
            kv_size = 8 if lean is not None and lean.attention_dtype == torch.float64 else 4
            step_floor = floor(engine.model, sum(len(ids) for ids, _ in cases) // len(cases),
                               plain["seconds"] / plain["tokens"] * 1000, kv_size)
        longest = max(files[:50], key=lambda f: f.stat().st_size)
        reuse = _keystroke_reuse(engine, longest, 1500)
        peak_mb = (torch.cuda.max_memory_allocated() / 2**20 if engine.device.type == "cuda"
                   else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    finally:
        for decoder in llama.values():
            decoder.close()
    return {"model": engine.name, "device": str(engine.device), "dtype": engine.status()["dtype"],
            "runtime": engine.status().get("runtime"), "baseline": "hf_greedy" if "hf_greedy" in results else "plain",
            "threads": threads, "prompts": len(cases), "gguf": str(gguf) if llama else None,
            "llama_cpp": None if not llama else {
                "baseline": "llama_server" if "llama_server" in llama else "llama_greedy",
                "llama_server": str(bin_dir / "llama-server") if "llama_server" in llama else None,
                "llama_cpp_python_build": build_flags() if set(llama) - {"llama_server"} else None},
            "prompt_tokens": [min(len(ids) for ids, _ in cases), max(len(ids) for ids, _ in cases)],
            "new_tokens": [min_new, max_new], "methods": rows, "keystroke_reuse": reuse, "floor": step_floor,
            "peak_memory_mb": round(peak_mb, 1)}


def first_difference(engine: LocalEngine, ids: list[int], plain: list[int], out: list[int], prompt: int) -> dict:
    """Where an output first leaves our plain greedy loop's, and by how much the plain step preferred
    its own token there: its logit minus the other's (a small margin: two kernels' rounding, near a
    tie; a large one: a bug). Positions past the shorter output: None."""
    at = next((j for j, (a, b) in enumerate(zip(plain, out)) if a != b), min(len(plain), len(out)))
    found = {"prompt": prompt, "position": at, "margin": None}
    if at < min(len(plain), len(out)):
        with torch.inference_mode():  # plain's own steps again: a prefill's batch rounds differently
            engine.prompt_cache.clear()
            _, logits = engine.runtime.prefill_hidden(list(ids))
            for token in plain[:at]:
                _, logits = engine.runtime.append(token)
        logits = logits.float() if isinstance(logits, torch.Tensor) else torch.from_numpy(logits).float()
        found["margin"] = round(float(logits[plain[at]] - logits[out[at]]), 4)
    return found


def _prompt(engine: LocalEngine, text: str, cut: int, chars: int, max_tokens: int) -> list[int]:
    """The engine's prompt at `cut`, with up to `chars` characters before it and 1,000 after, then
    shortened (from the far ends) until it has at most `max_tokens` tokens (0: no limit)."""
    before, after = chars, 1000
    while True:
        ids = engine.prompt_ids(text[max(0, cut - before):cut], text[cut:cut + after])
        if not max_tokens or len(ids) <= max_tokens or before < 8:
            return ids
        shrink = max_tokens / len(ids) * 0.95
        before, after = int(before * shrink), int(after * shrink)


def render(summary: dict) -> str:
    """The summary as a table and a few lines for a person."""
    rows, reuse = summary["methods"], summary["keystroke_reuse"]
    runtime = f"  runtime {summary['runtime']}" if summary.get("runtime") else ""
    lines = [f"model {summary['model']}{runtime}  device {summary['device']}  dtype {summary['dtype']}  threads "
             f"{summary['threads']}  prompts {summary['prompts']} of {summary['prompt_tokens'][0]}-"
             f"{summary['prompt_tokens'][1]} tokens  new tokens {summary['new_tokens'][0]}-{summary['new_tokens'][1]}"
             + (f"  llama.cpp on {summary['gguf']}" if summary.get("gguf") else ""),
             *([_baseline_line(summary["llama_cpp"])] if summary.get("llama_cpp") else []),
             table(rows, [("method", "method"), ("tokens_per_s", "tok/s"), ("speedup", "speedup"),
                          ("tokens_per_step", "tok/step"), ("exact_match", "= greedy"),
                          ("plain_match", "= plain"),
                          ("tokens_per_s_with_prefill", "tok/s +prefill"), ("speedup_with_prefill", "speedup +prefill")]
                   + ([("vs_llama_cpp", "vs llama.cpp"), ("vs_llama_cpp_with_prefill", "vs llama.cpp +prefill")]
                      if summary.get("gguf") else [])),
             "tok/s: decoding with the prompt already cached (as after a keystroke); +prefill: the whole prompt "
             "prefilled first, each method with its own forward; = greedy: the same tokens as transformers' generate "
             "from the bare prompt (on the llama.cpp runtime: as its plain loop); = plain: as our plain greedy loop; "
             f"speedup: against {summary.get('baseline', 'hf_greedy')}"]
    for row in rows:
        if row["sources"]:
            acc = ", ".join(f"{k} {v['accepted']}/{v['drafted']}" for k, v in row["sources"].items())
            heads = " ".join(f"{a:.2f}" for a in row["head_accuracy"] or [])
            lines.append(f"  {row['method']}: accepted/drafted nodes: {acc}" + (f"; head top-1: {heads}" if heads else ""))
        if row.get("differences"):
            where = ", ".join(f"prompt {d['prompt']} at token {d['position']}"
                              + (f" (margin {d['margin']})" if d["margin"] is not None else "")
                              for d in row["differences"])
            lines.append(f"  {row['method']}: left the plain loop's output on {where}")
    lines.append(f"keystroke on a {reuse['prompt_tokens']}-token prompt: prefilled {reuse['prefilled_tokens']} tokens "
                 f"({reuse['reused_tokens']} reused)")
    if (f := summary.get("floor")):
        lines.append(f"plain step {f['plain_ms_per_token']} ms a token against a memory floor of {f['floor_ms']} ms "
                     f"({f['weight_mb']} MB of weights + {f['kv_mb']} MB of KV at {f['cached_tokens']} tokens, read at "
                     f"{f['read_gb_per_s']} GB/s measured): {f['times_floor']}x the floor")
    lines.append(f"peak memory: {summary['peak_memory_mb']} MB")
    return "\n".join(lines)


def _baseline_line(llama: dict) -> str:
    """Which llama.cpp the `vs llama.cpp` columns divide by, and how the in-process one was built."""
    line = f"vs llama.cpp: against {llama['baseline']}" + (
        " (llama-server built natively for this CPU)" if llama["llama_server"]
        else " (llama-cpp-python in-process: no native build here, run engine/bench/build_llama_cpp.sh)")
    if llama["llama_cpp_python_build"]:
        line += f"; llama-cpp-python's build: {llama['llama_cpp_python_build']}"
    return line


def _keystroke_reuse(engine, path, prompt_tokens: int) -> dict:
    """Complete at a ~`prompt_tokens` prompt, then at the same prompt with one more character typed,
    as two keystrokes do."""
    text = path.read_text(encoding="utf-8", errors="replace")
    prefix = engine.decode(engine.encode(text)[:prompt_tokens])
    engine.prompt_cache.clear()
    engine.complete(prefix, max_new_tokens=4)
    typed = engine.complete(prefix + "x", max_new_tokens=4)
    return {"prompt_tokens": typed.prompt_tokens, "reused_tokens": typed.reused_tokens,
            "prefilled_tokens": typed.prompt_tokens - typed.reused_tokens}
