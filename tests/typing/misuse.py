"""What ``mypy --strict`` must refuse in an engine typed against the protocols: each line
marked ``# refused`` is an error, and no other line is."""

from __future__ import annotations

from harel_store import AsyncExecutionStore, Commit, Execution, ExecutionStore, open_store


def misuse(store: ExecutionStore, astore: AsyncExecutionStore) -> None:
    exe = Execution(id="e")
    store.commit_many([(exe, [])])  # refused
    store.ack_outbox("7")  # refused
    store.commit(exe, [], commit_id=7)  # refused
    store.claim_outbox(lease="long")  # refused
    store.delete_timer_many([("e", "p")])  # refused
    store.commit_many([Commit(exe)])[0].upper()  # refused
    astore.commit_many([Commit(exe)]).append(None)  # refused
    open_store("memory:").no_such_method()  # refused
    store.prune("7d")  # refused
    store.list_executions(after=3)  # refused
    store.overview(0.0)  # refused
