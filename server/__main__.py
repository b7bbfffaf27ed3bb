"""memosight-lsp: start the language server on stdio or TCP. Logs go to stderr or a file, never stdout."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import __version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memosight-lsp", description="MemoSight code-completion language server")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    mode.add_argument("--tcp", metavar="HOST:PORT", help="listen for one client on HOST:PORT")
    parser.add_argument("--log-file", help="write logs to this file instead of stderr")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"memosight-lsp {__version__}")
    parser.add_argument("--inject-faults", metavar="SPEC", type=fault_plan,
                        help="for reliability tests: make the engine fail or stall on purpose, e.g. "
                             "'raise=0.05,slow=0.05,slow_ms=400,seed=0' (see memosight bench soak)")
    args = parser.parse_args(argv)
    if args.tcp:
        host, sep, port = args.tcp.rpartition(":")
        if not sep or not host or not port.isdigit():
            parser.error(f"--tcp takes HOST:PORT, e.g. 127.0.0.1:7777, got {args.tcp!r}")
        args.host, args.port = host, int(port)
    return args


def fault_plan(spec: str):
    from memosight.engine.faults import FaultPlan

    try:
        return FaultPlan.parse(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def setup_logging(log_file: str | None, level: str) -> None:
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("memosight").setLevel(level.upper())
    # transformers' own advice (attention masks, progress bars) is noise in an editor's log.
    logging.getLogger("transformers").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its advice is noise in an editor's log
    setup_logging(args.log_file, args.log_level)
    from .lsp import create_server

    load_engine = None
    if args.inject_faults:
        from memosight.engine.faults import FaultyEngine

        from .engine_choice import load_engine_from_settings

        def load_engine(settings):
            return FaultyEngine(load_engine_from_settings(settings), args.inject_faults)
    server = create_server(load_engine)
    if args.tcp:
        server.start_tcp(args.host, args.port)
    else:
        server.start_io()
    return 0


if __name__ == "__main__":
    sys.exit(main())
