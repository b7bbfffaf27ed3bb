"""`memosight model list [--json]`: the catalog's models, their file size, whether each is here, and
the memory their weights take.

On a CPU a model's 4-bit GGUF file runs on llama.cpp as it is (the default): about the file's size,
plus its KV cache and buffers. On torch (`runtime = "torch"`, or a GPU) the file is dequantized when
it loads (float32 weights on a CPU, bfloat16 on a GPU): 4 bytes of RAM a parameter on a CPU and 2 of
GPU memory, plus the Python runtime, the KV caches and, on the first load, the dequantizing itself
(once per file; the result is cached on disk, as big as the float32 weights).
State: verified (sha256 checked), unchecked (the right size; the first load or pull checks it),
partial (an interrupted download of an older version; the next `memosight model pull` replaces it), wrong size, missing.
"""

from __future__ import annotations

import argparse

from .common import add_json_argument, print_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from memosight.engine import catalog

    models = [{"name": m.name, "file_bytes": m.size, "state": catalog.state(m), "path": str(m.path),
               "params": m.params, **m.memory(), "repo": m.repo, "revision": m.revision, "summary": m.summary}
              for m in catalog.CATALOG.values()]
    print_result({"models": models, "folder": str(catalog.models_dir())}, args.json, _render)
    return 0


def _render(result: dict) -> str:
    rows = [("NAME", "FILE", "STATE", "PARAMS", "RAM (CPU, llama.cpp)", "RAM (CPU, torch float32)",
             "IN GPU MEMORY (bfloat16)")]
    for m in result["models"]:
        rows.append((m["name"], f"{m['file_bytes'] / 1e6:,.0f} MB", m["state"], f"{m['params'] / 1e9:.2f}B",
                     f"~{m['cpu_llamacpp_gb']} GB", f"~{m['cpu_float32_gb']} GB", f"~{m['gpu_bfloat16_gb']} GB"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += ["", f"files: {result['folder']}",
              "memory: on a CPU the file runs on llama.cpp as it is (the default); on torch it is dequantized, "
              "and the process needs more: the runtime, the caches, and on the first load the dequantizing itself",
              "get one: memosight model pull NAME; then model = \"NAME\" in .memosight.toml"]
    return "\n".join(lines)
