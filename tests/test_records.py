"""The names ``harel_store`` exports, and its records, errors and protocols."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from _helpers import API_METHODS

import harel_store
from harel_store import (
    DEFAULT_TRACE_MAX,
    AsyncExecutionStore,
    Execution,
    ExecutionStore,
    OutboxEntry,
    SpawnEntry,
    StoreConflict,
    TimerOp,
)

EXPORTS = {
    "AsyncDictStore",
    "AsyncExecutionStore",
    "DEFAULT_TRACE_MAX",
    "DictStore",
    "Execution",
    "ExecutionStore",
    "IMPLEMENTATION",
    "OutboxEntry",
    "SpawnEntry",
    "StoreConflict",
    "TimerOp",
}


def test_exports() -> None:
    assert EXPORTS <= set(harel_store.__all__)
    for name in harel_store.__all__:
        assert hasattr(harel_store, name), name
    assert harel_store.IMPLEMENTATION in ("compiled", "pure")


def test_default_trace_max() -> None:
    assert DEFAULT_TRACE_MAX == 200


class TestExecution:
    FIELDS = frozenset(
        {
            "id",
            "definition_id",
            "status",
            "outcome",
            "active_path",
            "history",
            "context",
            "version",
            "parent_id",
            "child_id",
            "children",
        }
    )

    def test_fields_and_defaults(self) -> None:
        fields = {f.name: f for f in dataclasses.fields(Execution)}
        assert set(fields) == self.FIELDS
        required = {
            name
            for name, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert required == {"id"}

    def test_built_by_keywords(self) -> None:
        exe = Execution(id="e1", definition_id="order", context={"n": 1})
        assert (exe.id, exe.definition_id, exe.context, exe.version) == ("e1", "order", {"n": 1}, 0)

    def test_id_is_required(self) -> None:
        with pytest.raises(TypeError, match="id"):
            Execution()  # type: ignore[call-arg]

    @pytest.mark.parametrize("name", ["history", "context", "children"])
    def test_fresh_empty_container_per_instance(self, name: str) -> None:
        a, b = Execution(id="a"), Execution(id="b")
        assert len(getattr(a, name)) == 0
        assert getattr(a, name) is not getattr(b, name)
        getattr(a, name)["k"] = 1
        assert len(getattr(b, name)) == 0 and len(getattr(Execution(id="c"), name)) == 0

    def test_version_is_writable(self) -> None:
        exe = Execution(id="e1")
        exe.version += 1
        assert exe.version == 1


@pytest.mark.parametrize(
    ("record", "fields", "values"),
    [
        (OutboxEntry, ("seq", "target_id", "event"), (1, "t", "ev")),
        (
            SpawnEntry,
            ("seq", "parent_id", "child_id", "root_path", "context"),
            (1, "p", "c", "r", {}),
        ),
        (TimerOp, ("action", "path", "fire_at"), ("schedule", "p", 1.0)),
    ],
    ids=["OutboxEntry", "SpawnEntry", "TimerOp"],
)
class TestRecords:
    def test_field_order(
        self, record: type, fields: tuple[str, ...], values: tuple[Any, ...]
    ) -> None:
        assert record._fields == fields  # type: ignore[attr-defined]
        built = record(*values)
        assert tuple(getattr(built, f) for f in fields) == values
        assert built == record(**dict(zip(fields, values)))

    def test_immutable(
        self, record: type, fields: tuple[str, ...], values: tuple[Any, ...]
    ) -> None:
        built = record(*values)
        for name in fields:
            with pytest.raises(AttributeError):
                setattr(built, name, None)
        assert tuple(built) == values


def test_timer_op_fire_at_defaults_to_none() -> None:
    assert TimerOp("cancel", "p") == TimerOp(action="cancel", path="p", fire_at=None)


class TestStoreConflict:
    def test_attributes(self) -> None:
        err = StoreConflict("e1", expected=1, found=3)
        assert isinstance(err, Exception)
        assert (err.execution_id, err.expected, err.found) == ("e1", 1, 3)
        assert StoreConflict("e1", 1, 3).found == 3

    def test_message_names_the_execution_and_versions(self) -> None:
        with pytest.raises(StoreConflict, match=r"'e1'.*1.*3"):
            raise StoreConflict("e1", 1, 3)

    def test_pickles(self) -> None:
        err = pickle.loads(pickle.dumps(StoreConflict(("order", 7), 1, 3)))
        assert type(err) is StoreConflict
        assert (err.execution_id, err.expected, err.found) == (("order", 7), 1, 3)


class TestProtocols:
    def test_stores_satisfy_them(self, store: object, astore: object) -> None:
        assert isinstance(store, ExecutionStore)
        assert isinstance(astore, AsyncExecutionStore)

    def test_a_stranger_does_not(self) -> None:
        assert not isinstance(object(), ExecutionStore)
        assert not isinstance(object(), AsyncExecutionStore)

    @pytest.mark.parametrize("method", API_METHODS)
    def test_async_protocol_is_async(self, method: str) -> None:
        assert not inspect.iscoroutinefunction(getattr(ExecutionStore, method))
        assert inspect.iscoroutinefunction(getattr(AsyncExecutionStore, method))
