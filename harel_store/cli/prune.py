"""``python -m harel_store prune URL --older-than 7d``: delete the processed marks and
commit ids recorded before a horizon, and print how many."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import cast

from .._operate import duration
from ._common import PROG as COMMAND_LINE
from ._common import Command, _typed, execute, existing_store

PROG = f"{COMMAND_LINE} prune"
SUMMARY = "delete dedupe marks and commit ids older than an age such as 7d (URL)"
DESCRIPTION = (
    "Delete the processed marks and commit ids of every execution of the store at URL "
    "that were recorded more than --older-than ago (a number and s, m, h or d: 90s, 15m, "
    "12h, 7d), a few thousand rows per transaction so that committers never wait long, "
    "and print how many of each it deleted. An event whose mark was pruned is no longer "
    "deduplicated, and a replay of a pruned commit id is applied as a new commit: choose "
    "a horizon longer than any relay's retry window. Exits 0, 1 when the store cannot be "
    "written, 2 for a usage error (a bad URL or duration)."
)


@_typed("duration")
def _duration(text: str) -> float:
    try:
        return duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="sqlite:///path.db or postgresql://...")
    parser.add_argument(
        "--older-than", metavar="AGE", type=_duration, required=True,
        help="the horizon: a number and s, m, h or d (7d)",
    )  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true", help="nothing on stderr")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harel_store prune ARGV``: its exit code."""
    return execute(
        cast(Command, sys.modules[__name__]), PROG, sys.argv[1:] if argv is None else argv
    )


def run(args: argparse.Namespace) -> int:
    with existing_store(args.url, "prune") as (url, store):
        deleted = store.prune(args.older_than)
    print(
        f"pruned {url.shown}: {deleted['processed']:,} processed marks and "
        f"{deleted['commit_ids']:,} commit ids recorded more than {args.older_than:g} s ago"
    )
    return 0
