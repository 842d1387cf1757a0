"""The demonstration behind ``python -m harel_store``: many orders driven through a small
statechart workflow, using only the store's public API.

- :mod:`.workflow`: the state machines, the orders' seeded fates;
- :mod:`.local`: :func:`run`, one process on one store object with the specification's
  relays (``pending_*``/acks, ``due_timers``): memory stores, and the benchmarks;
- :mod:`.durable`: a resumable run on a durable store, whose relays and sweeper claim
  their work, with the run's clock and tallies kept in the store;
- :mod:`.workers`: the same, with the relays in N worker processes sharing one database;
- :mod:`.result`: what a run reports, and the checks every host makes.
"""

from .local import run
from .result import DemoResult, DemoStore, WorkerReport

__all__ = ["DemoResult", "DemoStore", "WorkerReport", "run"]
