"""`memosight bench speculative --corpus DIR [--json]`: speculative decoding against plain greedy.

Side by side in one run, same model, dtype and device, prompts cut from real source files:
transformers `generate` greedy (the baseline), transformers prompt-lookup decoding, our plain loop,
and our speculative loop with each draft source alone and all combined. Methods take turns on every
prompt, so machine noise falls on all of them alike. The main figures are decoding with the prompt
already cached (what a keystroke costs once the KV cache is reused); "+prefill" adds each method's
own prefill of the whole prompt (a cold prompt). For a GGUF model, llama.cpp on the same file and
thread count joins them: in-process (plain greedy and its prompt-lookup drafts) and, where built
(--build-llama-cpp), llama-server compiled natively for this CPU, the baseline. engine/bench/gpu.sh
runs it on a CUDA GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import MODEL_HELP, CommandError, add_json_argument, print_result, step_progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of source files (held-out code)")
    parser.add_argument("--model", help=MODEL_HELP)
    parser.add_argument("--shape", help="instead of --model's weights: a known model's shape with random weights, for "
                        "speed only (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b; the tokenizer is --model's)")
    parser.add_argument("--draft-model", help="a draft model with the same tokenizer: adds spec_draft_model and "
                        "hf_assisted (transformers' assisted generation with the same draft)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda")
    parser.add_argument("--dtype", default="float32", help="float32 (exact) | int8 | bfloat16 | float16")
    parser.add_argument("--runtime", default="torch", choices=["auto", "torch", "llamacpp"],
                        help="what runs the model: torch (default here: the transformers methods need it), "
                        "llamacpp (a GGUF file, or the model exported to one), auto")
    parser.add_argument("--prompts", type=int, default=24, help="number of cursor positions")
    parser.add_argument("--min-new", type=int, default=32)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=4000, help="text before the cursor in the prompt")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="cut each prompt to at most N tokens (e.g. 256 for a cold short prompt; 0: no cut)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for every method, llama.cpp included (default: the engine's own choice)")
    parser.add_argument("--gguf", help="the GGUF file llama.cpp runs (default: the file --model names, if it is one)")
    parser.add_argument("--build-llama-cpp", action="store_true",
                        help="build llama.cpp's llama-server natively for this CPU first when it is not built "
                        "(engine/bench/build_llama_cpp.sh; about 20 min on 2 cores, cached): the llama_server "
                        "baseline runs only where that build exists")
    parser.add_argument("--methods", default="all", help="comma list, or 'all'")
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from memosight.engine import load_engine
    from memosight.engine.bench.speculative import METHODS, render, run_speculative

    methods = METHODS if args.methods == "all" else tuple(m.strip() for m in args.methods.split(","))
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise CommandError(f"unknown method(s) {', '.join(sorted(unknown))}: choose from {', '.join(METHODS)}")
    if args.gguf and not Path(args.gguf).is_file():
        raise CommandError(f"--gguf {args.gguf!r} is not a file; give the GGUF file llama.cpp should run")
    if args.build_llama_cpp:
        from memosight.engine.bench.llama_server import native_bin_dir

        try:
            native_bin_dir(build=True)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
    if args.shape:
        from memosight.engine.bench.random_shape import random_model
        from memosight.engine.loading.files import cache_root

        try:
            args.model = str(random_model(args.shape, args.model, cache_root() / "random-shapes" / args.shape))
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
    try:
        engine = load_engine(args.model, device=args.device, dtype=args.dtype, draft_model=args.draft_model,
                             runtime=args.runtime)
    except Exception as exc:  # noqa: BLE001 - a model that cannot load is the user's to fix: said, not a traceback
        raise CommandError(str(exc)) from exc
    try:
        with step_progress("prompts", unit="prompt") as on_step:
            summary = run_speculative(engine, args.corpus, prompts=args.prompts, min_new=args.min_new,
                                      max_new=args.max_new, prompt_chars=args.prompt_chars,
                                      prompt_tokens=args.prompt_tokens, methods=methods, seed=args.seed,
                                      gguf=args.gguf, threads=args.threads,
                                      progress=lambda done, total: on_step(done, total, {}))
    except FileNotFoundError as exc:  # no corpus folder, or no source files in it
        raise CommandError(str(exc)) from exc
    except RuntimeError as exc:  # llama-cpp-python missing
        raise CommandError(str(exc)) from exc
    print_result(summary, args.json, render, cpu=True)
    return 0
