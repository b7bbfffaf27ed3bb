"""`memosight model pull NAME [--json]`: download a catalog model, so that `model = "NAME"` loads it.

    memosight model pull qwen2.5-coder-0.5b
    echo 'model = "qwen2.5-coder-0.5b"' >> .memosight.toml

The file comes from its Hugging Face repository at a pinned commit (HF_ENDPOINT names a mirror), with
a progress bar; an interrupted download continues where it stopped at the next pull. Its size and
sha256 are checked before it is moved into the cache (`memosight model list` shows where); a file
that is already there and checked is not downloaded again. Offline (HF_HUB_OFFLINE=1, or the hub out
of reach), the message says which URL to fetch by hand and where to put the file.
"""

from __future__ import annotations

import argparse

from .common import CommandError, add_json_argument, print_result, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="a name from `memosight model list`")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from memosight.engine.loading.catalog import CATALOG, PullError, pull

    if args.name not in CATALOG:
        raise CommandError(f"{args.name!r} is not in the model catalog; known: {', '.join(CATALOG)}")
    try:
        pulled = pull(args.name, say=say)
    except PullError as exc:
        raise CommandError(str(exc)) from exc
    print_result(pulled.to_json(), args.json, _render)
    return 0


def _render(result: dict) -> str:
    if result["downloaded"]:
        what = "downloaded and verified (sha256)"
    elif result["checked_now"]:
        what = "already present; verified now (sha256)"
    else:
        what = "already present and verified (sha256), nothing to download"
    return (f"{result['name']}: {what}: {result['path']} ({result['size']:,} bytes)\n"
            f"use it with model = \"{result['name']}\" in .memosight.toml or the editor's settings")
