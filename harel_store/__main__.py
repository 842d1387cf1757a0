"""``python -m harel_store``: the command line (:mod:`harel_store.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
