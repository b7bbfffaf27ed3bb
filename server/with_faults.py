"""memosight-lsp with an engine that fails on purpose: `python -m memosight.server.with_faults
--faults SPEC [memosight-lsp options]`, for `memosight bench soak` and reliability tests only. The
shipped entry point (server/__main__.py) knows nothing of it.

SPEC, e.g. 'raise=0.05,slow=0.05,slow_ms=400,seed=0': see memosight.engine.fault_injector.
"""

from __future__ import annotations

import argparse
import sys

from . import __main__ as lsp_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memosight.server.with_faults", add_help=False)
    parser.add_argument("--faults", required=True, metavar="SPEC")
    args, rest = parser.parse_known_args(argv)
    from memosight.engine import fault_injector

    from .request.engine_choice import load

    try:
        faulty = fault_injector(args.faults)
    except ValueError as exc:
        parser.error(f"--faults: {exc}")

    def load_engine(spec):
        return faulty(load(spec))
    return lsp_main.main(rest, load_engine)


if __name__ == "__main__":
    sys.exit(main())
