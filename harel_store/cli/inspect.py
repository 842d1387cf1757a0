"""``python -m harel_store inspect URL``: what a store holds, one line a figure
(``--json``: one object), or its figures served to Prometheus (``--serve PORT``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, cast

from .._operate import OVERVIEW_KEYS
from ._common import PROG as COMMAND_LINE
from ._common import Command, execute, existing_store
from ._common import whole_number as _whole_number

PROG = f"{COMMAND_LINE} inspect"
SUMMARY = "show what a store holds: counts, queue ages, leases, timers (URL)"
DESCRIPTION = (
    "Print the overview of the store at URL, one line a figure: how many executions, "
    "outbox and spawn entries, timers, processed marks and commit ids it holds; how old "
    "the oldest pending outbox and spawn entries are; the live and expired leases; the "
    "timers due now and when the next one fires. --json prints it as one JSON object; "
    "--serve PORT serves it to Prometheus on http://HOST:PORT/metrics (PORT 0: a free "
    "port, named on stderr) until SIGINT or SIGTERM, then exits 130 or 143, the store "
    "closed. Exits 0, 1 when the store cannot be read, 2 for a usage error (a bad URL)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="sqlite:///path.db or postgresql://...")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--serve", metavar="PORT", type=_whole_number, help="serve /metrics on PORT"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address --serve listens on")
    parser.add_argument("-q", "--quiet", action="store_true", help="nothing on stderr")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store inspect ARGV``: its exit code."""
    return execute(
        cast(Command, sys.modules[__name__]), PROG, sys.argv[1:] if argv is None else argv
    )


def run(args: argparse.Namespace) -> int:
    with existing_store(args.url) as (url, store):
        if args.serve is not None:
            from ._serve import serve

            return serve(store, url, args.host, args.serve, quiet=args.quiet)
        figures = cast(dict[str, Any], store.overview())
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(map(len, OVERVIEW_KEYS))
        for key in OVERVIEW_KEYS:
            print(f"{key:<{width}}  {shown(figures[key])}")
    return 0


def shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
