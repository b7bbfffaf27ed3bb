"""`memosight context FILE:LINE:COL [FILE:LINE:COL ...] --budget N [--json]`: the packed context the model
would see. With several cursors (one process, one model load, for studies over many cursors) and
--json, one JSON object per line, each with its `cursor`; a cursor that cannot be read gets an object
with an `error` instead, and the others go on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CommandError, add_json_argument
from .cursor import (
    Cursor,
    add_model_arguments,
    load_document,
    parse_cursor,
    settings_for,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cursors", type=parse_cursor, nargs="+", metavar="FILE:LINE:COL",
                        help="1-based line and column; several for one JSON object per line")
    parser.add_argument("--budget", type=int, default=None, help="prompt token budget (default: config, 1024)")
    parser.add_argument("--open", nargs="+", default=[], metavar="FILE",
                        help="other files open in the editor: definitions used at the cursor may come from them")
    parser.add_argument("--workspace", metavar="DIR",
                        help="index this folder as the editor's workspace, as the server does: its unopened files "
                             "may give definitions too")
    add_model_arguments(parser)
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..request.suggest import Suggester

    first = args.cursors[0]
    overrides = {"model": args.model, "device": args.device, "dtype": args.dtype, "context_budget": args.budget}
    others = [load_document(Cursor(Path(path), 1, 1))[0] for path in args.open]
    index = None
    if args.workspace:
        from ..context.workspace import WorkspaceIndex

        if not Path(args.workspace).is_dir():
            raise CommandError(f"--workspace {args.workspace} is not a folder")
        index = WorkspaceIndex(Path(args.workspace))
        index.scan()
    suggester = Suggester(fallback=False, workspace=lambda: index)
    engine = suggester.ensure_engine(settings_for(first.path, overrides)).result()  # fails: EngineError
    several = len(args.cursors) > 1
    failed = 0
    try:
        for spec in args.cursors:
            name = f"{spec.path}:{spec.line}:{spec.column}"
            try:
                settings = settings_for(spec.path, overrides)
                doc, cursor = load_document(spec)
            except CommandError as exc:
                if not several:
                    raise
                failed += 1
                print(json.dumps({"cursor": name, "error": str(exc)}) if args.json else f"{name}: {exc}")
                continue
            packed = suggester.context.build(engine, doc, cursor, settings, others=others)
            if args.json:
                print(json.dumps({"cursor": name, **packed.to_json()} if several else packed.to_json()), flush=True)
            else:
                if several:
                    print(f"=== {name}")
                print(f"prompt tokens: {packed.prompt_tokens} of {settings.context_budget}")
                for r in packed.regions:
                    print(f"  {r.kind:<14} lines {r.start_line}-{r.end_line}  score {r.score:.2f}  {r.path}")
                print("--- prefix ---")
                print(packed.prefix)
                print("--- suffix ---")
                print(packed.suffix)
    finally:
        suggester.close()  # engine thread joined: torch must not be busy while Python exits
    return 1 if failed else 0
