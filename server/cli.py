"""The `memosight` command: complete, context, bench, train. The composition root of the project.

Every tool is one module of memosight.server.commands following one pattern (see commands/common.py):
`add_arguments(parser)` and `run(args) -> int`, heavy imports inside `run`, so `memosight --help` is
instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand path -> (module of memosight.server.commands implementing add_arguments/run, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("complete",): ("complete", "complete at FILE:LINE:COL and print the suggestion"),
    ("context",): ("context", "show the packed context for FILE:LINE:COL"),
    ("bench", "context"): ("bench_context", "context compression vs truncation: recall, exact match, needle, "
                                            "stability, build time"),
    ("bench", "quality"): ("bench_quality", "held-out loss, next-token accuracy, next-line exact match"),
    ("bench", "speculative"): ("bench_speculative", "speculative decoding vs greedy, side by side"),
    ("bench", "replay"): ("bench_replay", "type real files back through memosight-lsp"),
    ("bench", "typing"): ("bench_typing", "a typist on held-out code: memosight beside llama.vim on llama-server"),
    ("bench", "soak"): ("bench_soak", "long typing through memosight-lsp with engine faults injected"),
    ("bench", "fuzz"): ("bench_fuzz", "a hostile client at scale: seeds x messages, each request answered once, "
                                      "documents intact, peak memory"),
    ("train", "model"): ("train_model", "train the base code model (FIM objective)"),
    ("train", "heads"): ("train_heads", "train the draft heads of a model (base frozen)"),
    ("train", "draft"): ("train_draft", "train a draft model for a target by distillation"),
    ("train", "ngrams"): ("train_ngrams", "count the corpus n-gram table that drafts where the prompt has no match"),
    ("train", "context"): ("train_context", "fine-tune a model on prompts in the context compressor's format"),
    ("export", "gguf"): ("export_gguf", "write a model as a GGUF file for llama.cpp"),
    ("model", "pull"): ("model_pull", "download a catalog model (checked, resumable) so that model = \"NAME\" loads it"),
    ("model", "list"): ("model_list", "the catalog's models: file size, whether each is here, the memory it needs"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memosight", description="MemoSight code completion tools")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): parser.add_subparsers(dest="command", required=True)}
    for path, (module, help_text) in COMMANDS.items():
        for depth in range(1, len(path)):
            if path[:depth] not in groups:
                sub = groups[path[: depth - 1]].add_parser(path[depth - 1], help=f"{path[depth - 1]} commands")
                groups[path[:depth]] = sub.add_subparsers(dest=f"{path[depth - 1]}_command", required=True)
        sub = groups[path[:-1]].add_parser(path[-1], help=help_text, description=help_text,
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(_module=module)
        try:
            loaded = _load(module)
            loaded.add_arguments(sub)
            sub.epilog = loaded.__doc__  # what the command measures or does, in full
        except ImportError as exc:  # a broken install of one command must not take down the others
            sub.set_defaults(_broken=f"{' '.join(path)} is unavailable: {exc}")
    return parser


def _load(module: str):
    return importlib.import_module(f"memosight.server.commands.{module}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_broken", None):
        print(f"memosight: {args._broken}", file=sys.stderr)
        return 2
    from memosight.engine.protocol import EngineError

    from .commands.common import CommandError

    _end_on_sigterm()
    try:
        return int(_load(args._module).run(args) or 0)
    except (CommandError, EngineError) as exc:  # the user can fix these: one line, no traceback
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that it ends through its cleanup as on Ctrl-C (the
    llama-server and memosight-lsp processes a benchmark started are closed, not orphaned)."""


def _end_on_sigterm() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def terminated(signum, frame):
            raise Terminated

        signal.signal(signal.SIGTERM, terminated)


if __name__ == "__main__":
    sys.exit(main())
