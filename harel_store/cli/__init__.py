"""The command line: ``python -m harel_store [COMMAND] [OPTIONS]``.

Each command is a module of this package, listed in :data:`COMMANDS`, with ``SUMMARY``,
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> int``; what they share
(store URLs, errors, exit codes, signals, a closed pipe) is :mod:`._common`. Without a
command, ``python -m harel_store`` runs the demonstration (:mod:`.demo`). Adding a
command is writing its module and listing it here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import cast

from ._common import PROG, Command, execute, refuse

__all__ = ["COMMANDS", "DEFAULT", "command", "main"]

# The name of each command on the command line, and its module in this package.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "copy": "copy",
    "inspect": "inspect",
    "show": "show",
    "prune": "prune",
}
DEFAULT = "demo"  # the command of a command line that names none
SHARED_FLAGS = frozenset({"-q", "--quiet"})  # every command takes these: they may come first


def command(name: str) -> Command:
    """The module of the command ``name``."""
    return cast(Command, importlib.import_module(f"{__name__}.{COMMANDS[name]}"))


def _listing() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {command(name).SUMMARY}" for name in COMMANDS]
    return "\n".join(
        [
            "commands (python -m harel_store COMMAND --help says more; without one, the demo runs):",
            *lines,
            "",
            "exit status (every command): 0 done; 1 the operation failed; 2 usage error (a",
            "bad option or URL); 130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM, saying",
            "what was done and how to finish; 141 the output pipe was closed.",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``): its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0] not in COMMANDS:
        return refuse(
            PROG,
            f"{args[0]!r} is not a command; the commands are {', '.join(COMMANDS)} "
            f"(see {PROG} --help)",
        )
    for at, word in enumerate(args):
        if word in COMMANDS:
            if all(arg in SHARED_FLAGS for arg in args[:at]):
                return execute(command(word), f"{PROG} {word}", args[:at] + args[at + 1 :])
            if word != DEFAULT:
                return refuse(
                    PROG,
                    f"{word} takes its own options, after it: {PROG} {word} ... "
                    f"(see {PROG} {word} --help)",
                )
            break
        if word == "--":
            break
    return execute(command(DEFAULT), PROG, args, epilog=_listing())
