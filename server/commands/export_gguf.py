"""`memosight export gguf --out FILE [--model M]`: write a model as a GGUF file llama.cpp serves.

    memosight export gguf --out /tmp/memosight.gguf
    python -m llama_cpp.server --model /tmp/memosight.gguf        # or llama.cpp's llama-server -m

The embedded model by default. Llama models with a byte-level BPE tokenizer; the FIM tokens are set,
so llama.cpp's /infill writes the model's own fill-in-the-middle prompt (engine/loading/export_gguf.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CommandError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="FILE", help="the .gguf file to write")
    parser.add_argument("--model", help="model folder or packaged name (default: the embedded model)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"])


def run(args: argparse.Namespace) -> int:
    from memosight.engine.loading.export_gguf import export_gguf
    from memosight.engine import load_engine

    out = Path(args.out)
    if not out.parent.is_dir():
        raise CommandError(f"the folder of --out {str(out)!r} does not exist")
    report = export_gguf(load_engine(args.model, device="cpu", dtype="float32", runtime="torch"), out, args.dtype)
    print(json.dumps(report))
    return 0
