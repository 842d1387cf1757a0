"""Prometheus gauges of a store's overview (``pip install 'harel-store[metrics]'``).

:class:`StoreCollector` reads ``store.overview()`` at each scrape and reports every figure
as a gauge named ``harel_store_<figure>`` (the ages in seconds, ``next_timer_at`` on the
store's clock); a figure that is ``None`` (no pending entry, no timer) is left out of that
scrape. Register it in the host's own registry::

    from prometheus_client import REGISTRY
    from harel_store.metrics import StoreCollector

    REGISTRY.register(StoreCollector(store))

``python -m harel_store inspect URL --serve PORT`` serves the same gauges on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["StoreCollector"]

_HELP = {
    "executions": "Executions the store holds.",
    "outbox": "Pending outbox entries.",
    "spawns": "Pending spawn intents.",
    "timers": "Armed timers.",
    "processed": "Processed marks (the dedupe records of handled events).",
    "commit_ids": "Commit ids kept to recognise replays.",
    "outbox_oldest_age": "Seconds since the oldest pending outbox entry was committed.",
    "spawns_oldest_age": "Seconds since the oldest pending spawn intent was committed.",
    "outbox_leased": "Outbox entries under a live lease.",
    "spawns_leased": "Spawn intents under a live lease.",
    "timers_leased": "Timers under a live lease.",
    "expired_leases": "Leases that ran out before their entry or timer was acked.",
    "timers_due": "Timers due now.",
    "next_timer_at": "When the next timer not yet due fires, on the store's clock.",
}


class StoreCollector(Collector):
    """A collector of the overview of ``store`` (any sync store of this package), read
    at each scrape; ``prefix`` begins every gauge's name."""

    def __init__(self, store: Any, *, prefix: str = "harel_store") -> None:
        self._store = store
        self._prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge per figure of the overview that is not ``None``."""
        figures = self._store.overview()
        for key, help_text in _HELP.items():
            value = figures.get(key)
            if value is not None:
                yield GaugeMetricFamily(f"{self._prefix}_{key}", help_text, value=float(value))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """Nothing: the gauges are found at each scrape (the store is not read at
        registration)."""
        return iter(())
