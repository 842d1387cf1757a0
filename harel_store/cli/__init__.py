"""The command line: ``python -m harel_store``."""

from .demo import main

__all__ = ["main"]
