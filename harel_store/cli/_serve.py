"""``inspect URL --serve PORT``: the store's overview served to Prometheus on /metrics
until SIGINT or SIGTERM."""

from __future__ import annotations

import sys
import threading
from typing import Any

from ._common import SIGNALS, Failed, StoreURL


def serve(store: Any, url: StoreURL, host: str, port: int, *, quiet: bool = False) -> int:
    try:
        from prometheus_client import CollectorRegistry, start_http_server

        from ..metrics import StoreCollector
    except ImportError:
        raise Failed(
            "--serve needs prometheus-client: pip install 'harel-store[metrics]'"
        ) from None
    registry = CollectorRegistry()
    registry.register(StoreCollector(_Locked(store)))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise Failed(f"cannot serve on {host}:{port}: {exc}") from None
    if not quiet:
        print(f"serving {url.shown} on http://{host}:{port}/metrics", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except SIGNALS:
        pass
    finally:
        server.shutdown()
        thread.join(5)
    return 0


class _Locked:
    """The store read by one scrape at a time."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()

    def overview(self) -> Any:
        with self._lock:
            return self._store.overview()
