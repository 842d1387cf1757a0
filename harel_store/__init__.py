"""harel_store: the execution store of a Harel-statechart workflow engine."""

from . import _env

if _env.switches()[0]:  # before any module that a build compiles from its source
    _env.prefer_sources()

from ._aio import AsyncDictStore
from ._copy import copy_store
from ._errors import IdempotencyConflict, StaleWriter, StoreConflict, StoreError
from ._open import open_async_store, open_store
from ._protocols import AsyncExecutionStore, ExecutionStore
from ._records import DEFAULT_TRACE_MAX, Commit, Execution, OutboxEntry, SpawnEntry, TimerOp
from ._store import IMPLEMENTATION, DictStore
from ._version import __version__

__all__ = [
    "DEFAULT_TRACE_MAX",
    "IMPLEMENTATION",
    "AsyncDictStore",
    "AsyncExecutionStore",
    "Commit",
    "DictStore",
    "Execution",
    "ExecutionStore",
    "IdempotencyConflict",
    "OutboxEntry",
    "SpawnEntry",
    "StaleWriter",
    "StoreConflict",
    "StoreError",
    "TimerOp",
    "__version__",
    "copy_store",
    "open_async_store",
    "open_store",
]
