"""`memosight train heads`: train the draft heads of a model (base frozen), resumable.

    memosight train heads --corpus stdlib --out /work/runs/heads                 # the embedded model
    memosight train heads --model DIR --corpus DIR --out RUN --save-to DIR       # any causal LM
    memosight train heads --model DIR --out RUN --resume

Top-level imports stay light: `memosight --help` imports this module.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="training code (repeatable): a folder, 'stdlib' or 'site' (default: stdlib)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder for checkpoints")
    parser.add_argument("--save-to", metavar="DIR", help="where the heads go (default: the model folder)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda (default auto)")
    parser.add_argument("--heads", type=int, default=4, help="number of heads K (default 4)")
    parser.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--positions", type=int, default=512, help="positions scored per step (default 512)")
    parser.add_argument("--fim-rate", type=float, default=0.5,
                        help="share of training pieces in the engine's fill-in-the-middle prompt format (default 0.5)")
    parser.add_argument("--decay", type=float, default=0.8, help="per-head loss weight decay**k (default 0.8)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--max-files", type=int, default=2000, help="cap on corpus files read")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/heads_state.pt")


def run(args: argparse.Namespace) -> int:
    import sys

    import torch
    from tqdm import tqdm

    from ..loading import ModelLoadError, load_engine
    from . import heads as H
    from .corpus import build_corpus, resolve_sources

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        engine = load_engine(args.model, device=args.device, dtype="float32")
    except ModelLoadError as exc:
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)  # load_engine picks decoding threads; training wants these
    else:
        torch.set_num_threads(__import__("os").cpu_count() or 1)
    model, tokenizer = engine.model, engine.tokenizer
    for p in model.parameters():
        p.requires_grad_(False)
    save_to = Path(args.save_to) if args.save_to else (
        Path(engine.name) if args.model else Path(__file__).resolve().parents[1] / "models" / "default")
    cfg = H.HeadsTrainConfig(num_heads=args.heads, num_layers=args.layers, seq_len=args.seq_len, batch=args.batch,
                             steps=args.steps, lr=args.lr, decay=args.decay, positions=args.positions, seed=args.seed,
                             checkpoint_every=args.checkpoint_every)
    corpus = build_corpus(resolve_sources(args.corpus or ["stdlib"]))
    rng = __import__("random").Random(args.seed)
    train_files = sorted(corpus.train, key=lambda f: f.path)
    rng.shuffle(train_files)
    train_files = train_files[: args.max_files]
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    # Prompts in the engine's own format: what the heads see at a cursor (plain prefix for non-FIM models).
    fim = {"fim_prompt": engine.prompt_ids, "fim_rate": args.fim_rate, "seed": args.seed} if engine.fim.name != "plain" else {}
    windows = H.windows_from_texts(tokenizer, [f.text for f in train_files], cfg.seq_len, eos, **fim).to(engine.device)
    val_files = sorted(corpus.validation, key=lambda f: f.path)[:60] or train_files[-20:]
    val_windows = H.windows_from_texts(tokenizer, [f.text for f in val_files], cfg.seq_len, eos, **fim)[:64].to(engine.device)
    if len(windows) == 0:
        print("memosight: the corpus is too small for one training window; give more code", file=sys.stderr)
        return 2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    heads = H.new_heads(model, cfg).to(engine.device)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    state = H.HeadsState()
    if args.resume:
        if not (out / "heads_state.pt").exists():
            print(f"memosight: nothing to resume in {out} (no heads_state.pt)", file=sys.stderr)
            return 2
        state = H.load_checkpoint(out, heads, optimizer)
    print(f"training {cfg.num_heads} heads on {len(windows)} windows of {cfg.seq_len} tokens "
          f"({len(train_files)} files); step {state.step}/{cfg.steps}", file=sys.stderr)
    with tqdm(total=cfg.steps, initial=state.step, desc="heads", unit="step", file=sys.stderr) as bar:
        H.train_heads(model, heads, windows, cfg, state, optimizer,
                      checkpoint=lambda s: H.save_checkpoint(out, heads, optimizer, s), progress=bar)
    heads.eval()
    accuracy = H.head_accuracy(heads, model, val_windows) if len(val_windows) else []
    save_to.mkdir(parents=True, exist_ok=True)
    heads.save(save_to)
    report = {"steps": state.step, "train_seconds": round(state.elapsed_s, 1), "heads": accuracy,
              "saved_to": str(save_to), "windows": len(windows), "seq_len": cfg.seq_len}
    (out / "heads_report.json").write_text(json.dumps(report, indent=2))
    for row in accuracy:
        print(f"head {row['head']}: top-1 {row['top1']:.3f}  top-3 {row['top3']:.3f}")
    print(json.dumps(report))
    return 0
