"""harel_store: the execution store of a Harel-statechart workflow engine."""

from ._aio import AsyncDictStore
from ._errors import StoreConflict
from ._protocols import AsyncExecutionStore, ExecutionStore
from ._records import DEFAULT_TRACE_MAX, Execution, OutboxEntry, SpawnEntry, TimerOp
from ._store import IMPLEMENTATION, DictStore

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TRACE_MAX",
    "IMPLEMENTATION",
    "AsyncDictStore",
    "AsyncExecutionStore",
    "DictStore",
    "Execution",
    "ExecutionStore",
    "OutboxEntry",
    "SpawnEntry",
    "StoreConflict",
    "TimerOp",
    "__version__",
]
