"""``inspect URL --serve PORT``: the store's overview served to Prometheus on /metrics
until SIGINT or SIGTERM."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

from ._common import SIGNALS, Failed, StoreURL, signal_exit, signal_name


def serve(store: Any, url: StoreURL, host: str, port: int, *, quiet: bool = False) -> int:
    """Serve ``store``'s overview on ``/metrics`` until SIGINT or SIGTERM: the exit code of
    a server that signal stopped (130, 143), once the server is shut down; the caller
    closes the store. Port 0 serves on a free port, which the line on stderr names."""
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
    where = f"http://{host}:{server.server_port}/metrics"
    try:
        _say(quiet, f"serving {url.shown} on {where}")
        threading.Event().wait()  # never set: the signal ends the wait
    except SIGNALS as exc:
        signalled = exc
    finally:
        server.shutdown()
        thread.join(5)
    _say(quiet, f"stopped serving {where} ({signal_name(signalled)})")
    return signal_exit(signalled)


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        with contextlib.suppress(OSError, ValueError):  # stderr may be gone by then
            print(line, file=sys.stderr, flush=True)


class _Locked:
    """The store read by one scrape at a time."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()

    def overview(self) -> Any:
        with self._lock:
            return self._store.overview()
