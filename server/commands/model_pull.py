"""`memosight model pull NAME [--json]`: download a catalog model, so that `model = "NAME"` loads it.

    memosight model pull qwen2.5-coder-0.5b
    echo 'model = "qwen2.5-coder-0.5b"' >> .memosight.toml

The file comes from its Hugging Face repository at a pinned commit (HF_ENDPOINT names a mirror), with
a progress bar on stderr (HF_HUB_DISABLE_PROGRESS_BARS=1 hides it); a broken connection is picked up
where it stopped, but an interrupted pull starts over at the next one. Its size and
sha256 are checked before it is moved into the cache (`memosight model list` shows where); a file
that is already there and checked is not downloaded again. Offline (HF_HUB_OFFLINE=1, or the hub out
of reach), the message says which URL to fetch by hand and where to put the file.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import CommandError, add_json_argument, print_result, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="a name from `memosight model list`")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from memosight.engine import catalog

    if args.name not in catalog.CATALOG:
        raise CommandError(f"{args.name!r} is not in the model catalog; known: {', '.join(catalog.CATALOG)}")
    bar = _Bar(args.name)
    try:
        pulled = catalog.pull(args.name, say=say, progress=bar)
    except catalog.PullError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        bar.close()
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


class _Bar:
    """The download's bar on stderr, fed pull's progress(done_bytes, total_bytes); it closes at the
    last byte, so that the sha256 check's line comes below it."""

    def __init__(self, name: str):
        self.name = name
        self.bar = None
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            hidden = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
            self.bar = tqdm(total=total, desc=self.name, unit="B", unit_scale=True, unit_divisor=1024,
                            file=sys.stderr, disable=hidden, dynamic_ncols=True)
        self.bar.update(done - self.shown)
        self.shown = done
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
