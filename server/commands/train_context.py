"""`memosight train context`: fine-tune a model on prompts in the compressor's own format, resumable.

    memosight train context --out /work/runs/ctx                       # the embedded model, stdlib + site
    memosight train context --model DIR --corpus DIR --out RUN --save-to DIR
    memosight train context --out RUN --resume

A model pretrained on whole files has never seen a packed context: elision markers, definitions
pulled from far above or from other files, the cursor's function last. This builds examples with the
server's compressor at random cursors of the training corpus (most compressed, some plainly
truncated), the text the user writes next as the target, and trains the model to write it and stop.
The same corpus split as `memosight train model` keeps held-out files out; their middle loss is
measured before and after. The result is a complete model folder (the base's draft heads and n-gram
table are copied: still lossless, but retrain them for this model with `train heads` / `train ngrams`).

Measured on the embedded model (600 steps, 48 min on 2 CPU threads): held-out middle loss 4.09 -> 3.67
nats/token and plain held-out loss 3.446 -> 3.424, yet fewer characters accepted in `bench replay`
(251 against 286 over 14 functions): it suggests more often and is right less often. So the shipped
model is not fine-tuned this way; try it on a bigger model, and check `bench replay` before shipping.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

DEFAULT_CORPUS = ("stdlib", "site")
COPIED_FILES = ("memosight.json", "draft_heads.safetensors", "draft_heads.json", "draft_ngrams.npz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="base model folder or hub id (default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="training code (repeatable): a folder, 'stdlib' or 'site' (default: both)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder for examples and checkpoints")
    parser.add_argument("--save-to", metavar="DIR", help="where the fine-tuned model goes (default: OUT/model)")
    parser.add_argument("--per-file", type=int, default=8, help="cursor positions per training file (default 8)")
    parser.add_argument("--max-files", type=int, default=2000, help="cap on training files used (default 2000)")
    parser.add_argument("--truncated-share", type=float, default=0.3,
                        help="share of examples with plain truncation instead of the compressor (default 0.3)")
    parser.add_argument("--eval-examples", type=int, default=300, help="held-out examples scored (default 300)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--prompt-weight", type=float, default=0.1,
                        help="loss weight of prompt tokens against the middle's 1 (default 0.1)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/finetune_state.pt")


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from memosight.engine.loading import ModelLoadError, load_engine
    from memosight.engine.train import finetune as F

    out = Path(args.out)
    if args.resume and not (out / "finetune_state.pt").is_file():
        print(f"memosight: nothing to resume in {out} (no finetune_state.pt); run without --resume", file=sys.stderr)
        return 2
    try:
        engine = load_engine(args.model, device=args.device, dtype="float32")
    except ModelLoadError as exc:
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or torch.get_num_threads())
    out.mkdir(parents=True, exist_ok=True)
    examples_file = out / "examples.pt"
    if examples_file.is_file():  # a resumed run trains on exactly the same examples
        saved = torch.load(examples_file, weights_only=False)
        train_rows, eval_rows = saved["train"], saved["eval"]
    else:
        try:
            train_rows, eval_rows = _build_rows(engine, args)
        except ValueError as exc:
            print(f"memosight: {exc}", file=sys.stderr)
            return 2
        torch.save({"train": train_rows, "eval": eval_rows}, examples_file)
    print(f"{len(train_rows)} training examples, {len(eval_rows)} held-out", file=sys.stderr)

    pad_id = min(engine.eos_ids)
    cfg = F.FinetuneConfig(steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                           prompt_weight=args.prompt_weight, seed=args.seed)
    model = engine.model
    optimizer = F.make_optimizer(model, cfg)
    report_file = out / "finetune_report.json"
    if args.resume:
        saved_cfg, state = F.load_state(out, model, optimizer)
        cfg.seed = saved_cfg.seed  # the batch order must not change under a resumed run
        report = json.loads(report_file.read_text())
    else:
        state = F.FinetuneState()
        report = {"held_out_middle_loss_before": _held_out(model, eval_rows, pad_id),
                  "train_examples": len(train_rows), "held_out_examples": len(eval_rows),
                  "command": " ".join(sys.argv)}
        report_file.write_text(json.dumps(report, indent=2) + "\n")
    bar = tqdm(total=cfg.steps, initial=state.step, desc="train context", unit="step", file=sys.stderr)

    def on_step(state: F.FinetuneState, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", middle=state.history[-1]["middle_loss"])
        if state.step % args.checkpoint_every == 0 or state.step == cfg.steps:
            F.save_state(out, model, optimizer, cfg, state)

    F.finetune(model, train_rows, pad_id, cfg, state, optimizer, on_step)
    bar.close()
    report.update({"held_out_middle_loss_after": _held_out(model, eval_rows, pad_id),
                   "steps": state.step, "train_minutes": round(state.seconds / 60, 1), **vars(cfg)})
    report_file.write_text(json.dumps(report, indent=2) + "\n")
    save_to = Path(args.save_to) if args.save_to else out / "model"
    _export(engine, save_to)
    print(f"held-out middle loss {report['held_out_middle_loss_before']} -> {report['held_out_middle_loss_after']} "
          f"nats/token; model saved to {save_to}")
    return 0


def _held_out(model, rows, pad_id) -> float | None:
    from memosight.engine.train.finetune import middle_loss

    return round(middle_loss(model, rows, pad_id), 4) if rows else None  # a small corpus may hold none out


def _build_rows(engine, args) -> tuple[list, list]:
    import random

    from memosight.engine.train.corpus import build_corpus, resolve_sources
    from memosight.engine.train.finetune import encode_example

    from ..context.examples import context_examples

    corpus = build_corpus(resolve_sources(args.corpus or DEFAULT_CORPUS), val_fraction=0.03)
    if not corpus.train:
        raise ValueError(f"no training files found in {args.corpus or DEFAULT_CORPUS}")
    rng = random.Random(args.seed)
    train_files = rng.sample(corpus.train, min(args.max_files, len(corpus.train)))
    start = time.perf_counter()

    def rows(files, per_file, limit=None):
        found = []
        for example in context_examples(_documents(files), engine.count_tokens, rng, per_file=per_file,
                                        truncated_share=args.truncated_share):
            found.append(encode_example(engine, example.prefix, example.suffix, example.middle))
            if limit and len(found) >= limit:
                break
        return found

    train_rows = rows(train_files, args.per_file)
    eval_rows = rows(corpus.validation, 4, args.eval_examples)
    print(f"examples built in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return train_rows, eval_rows


def _documents(files) -> list:
    from ..context.languages import LANGUAGES_BY_SUFFIX
    from ..documents import Document

    docs = []
    for f in files:
        language = LANGUAGES_BY_SUFFIX.get(Path(f.path).suffix)
        if language:
            docs.append(Document("file:///corpus/" + f.path, f.text, language))
    return docs


def _export(engine, save_to: Path) -> None:
    import torch

    save_to.mkdir(parents=True, exist_ok=True)
    engine.model.to(torch.bfloat16).save_pretrained(str(save_to))  # the size the embedded model ships at
    engine.model.to(torch.float32)
    engine.tokenizer.save_pretrained(str(save_to))
    base = Path(engine.model_dir) if engine.model_dir else None
    for name in COPIED_FILES:
        if base and (base / name).is_file() and base.resolve() != save_to.resolve():
            shutil.copy(base / name, save_to / name)
    for path in save_to.iterdir():
        path.chmod(0o644)  # save_pretrained writes the weights 0600; package data must be readable
