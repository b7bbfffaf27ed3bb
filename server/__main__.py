"""memosight-lsp: start the language server on stdio or TCP. Logs go to stderr or a file, never stdout."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import logging.handlers
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from . import __version__

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memosight-lsp", description="MemoSight code-completion language server")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    mode.add_argument("--tcp", metavar="HOST:PORT", help="listen for one client on HOST:PORT")
    parser.add_argument("--log-file", help="write logs to this file instead of stderr")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"memosight-lsp {__version__}")
    args = parser.parse_args(argv)
    if args.tcp:
        host, sep, port = args.tcp.rpartition(":")
        if not sep or not host or not port.isdigit():
            parser.error(f"--tcp takes HOST:PORT, e.g. 127.0.0.1:7777, got {args.tcp!r}")
        args.host, args.port = host, int(port)
    return args


LOG_FILE_BYTES = 10 * 2**20


def setup_logging(log_file: str | None, level: str) -> None:
    # A log file is bounded: at 10 MB it moves to FILE.1 (the one before is dropped) and starts anew.
    handler: logging.Handler = (logging.handlers.RotatingFileHandler(log_file, maxBytes=LOG_FILE_BYTES, backupCount=1)
                                if log_file else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("memosight").setLevel(level.upper())
    # transformers' own advice (attention masks, progress bars) is noise in an editor's log.
    logging.getLogger("transformers").setLevel(logging.ERROR)


def main(argv: list[str] | None = None, load_engine=None) -> int:
    """The server. `load_engine(spec)`: how the engine the settings name is made (default: as they say;
    server/with_faults.py passes one that fails on purpose, for `bench soak`)."""
    args = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its advice is noise in an editor's log
    setup_logging(args.log_file, args.log_level)
    from .lsp import create_server

    server = create_server(load_engine)
    try:
        if args.tcp:
            serve_tcp(server, args.host, args.port)
        else:
            serve_stdio(server)
    finally:
        leave(server, 0)
    return 0  # not reached: leave() ends the process


EXIT_WAIT_S = 2.0  # for a cancelled run to let go of the engine (a step, or a chunk of a prefill)


def leave(server, code: int) -> None:
    """End the process once the client is gone: stop the work in flight, give the engine thread a
    moment, and exit without the interpreter's teardown. A thread still inside torch, llama.cpp or
    tree-sitter while the interpreter goes down takes the process with SIGABRT ("terminate called
    without an active exception"): an editor that closed the pipe got a core dump, not an exit code."""
    try:
        server.suggester.shutdown()
        if not server.suggester.engine.wait_idle(EXIT_WAIT_S):
            log.info("leaving with the engine thread still busy (a model load?)")
    finally:
        with contextlib.suppress(Exception):  # a closed pipe must not keep us from leaving
            logging.shutdown()
            sys.stdout.flush()
        os._exit(code)


def serve_stdio(server, stdin=None, stdout=None) -> None:
    """One session on stdin/stdout, until the client closes stdin (or sends exit)."""
    from .rpc.connection import serve
    from .rpc.framing import FrameWriter, stdin_reader

    server.connection.set_writer(FrameWriter(stdout or sys.stdout.buffer))
    reader = ThreadPoolExecutor(1, thread_name_prefix="stdin")  # reads block: off the event loop
    try:
        asyncio.run(serve(stdin_reader(stdin or sys.stdin.buffer, reader), server.connection))
    except BrokenPipeError:
        log.error("the connection to the client is lost; shutting down")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        reader.shutdown(wait=False, cancel_futures=True)
        server.suggester.shutdown()  # the client is gone: a generation still running stops


def serve_tcp(server, host: str, port: int) -> None:
    """One session with the first client that connects to host:port; the server ends with it."""
    from .rpc.connection import serve
    from .rpc.framing import FrameWriter
    listener, connected = None, False

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connected
        if connected:  # one client, one session (as on stdio): a second would share its state
            log.warning("refused a second connection; this server has a client")
            writer.close()
            return
        connected = True
        server.connection.set_writer(FrameWriter(writer))
        try:
            await serve(reader.read, server.connection)
        except OSError as exc:  # a reset connection ends the session like a closed one
            log.error("the connection to the client is lost (%s); shutting down", exc)
        finally:
            writer.close()
            listener.close()

    async def listen() -> None:
        nonlocal listener
        listener = await asyncio.start_server(connection, host, port)
        async with listener:
            await listener.serve_forever()

    try:
        asyncio.run(listen())
    except asyncio.CancelledError:
        pass


if __name__ == "__main__":
    sys.exit(main())
