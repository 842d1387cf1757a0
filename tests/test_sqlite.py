"""What only the SQLite store has (issue 12): its codec, its schema, reopening a file,
``synchronous``, a closed store, the async twin's thread, and indexes that keep the
operations cheap as the database grows.

The contract every store keeps runs on SQLite through the conformance kinds of
``conftest.py`` (``tests/test_protocol.py``); the tests with several processes are in
``tests/test_durable.py``.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import decimal
import enum
import math
import os
import pickle
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from _keyed import KEYED_CALLS
from hypothesis import given
from hypothesis import strategies as st

import harel_store
from harel_store import (
    Commit,
    Execution,
    IdempotencyConflict,
    OutboxEntry,
    SpawnEntry,
    StaleWriter,
    StoreConflict,
    StoreError,
    TimerOp,
    _codec,
)
from harel_store._checks import KEY_BYTES_MAX
from harel_store._codec import DEPTH_MAX
from harel_store.sqlite import (
    JSON,
    MIGRATIONS,
    SCHEMA_VERSION,
    AsyncSqliteStore,
    Codec,
    JsonCodec,
    SqliteStore,
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def opened(path: Path) -> Iterator[Callable[..., SqliteStore]]:
    """Open store objects on ``path``; all are closed after the test."""
    made: list[SqliteStore] = []

    def open_(**options: Any) -> SqliteStore:
        store = SqliteStore(path, **options)
        made.append(store)
        return store

    yield open_
    for store in made:
        store.close()


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (``nan`` equal to ``nan``,
    ``-0.0`` not equal to ``0.0``)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        )
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b  # type: ignore[no-any-return]


# --- the codec -----------------------------------------------------------------------

VALUES = {
    "none": None,
    "bools": [True, False],
    "ints": [0, -1, 2**63, -(2**200)],
    "floats": [0.0, -0.0, 1.5, 1e308, 5e-324, math.inf, -math.inf, math.nan],
    "float-that-looks-int": 3.0,
    "strs": ["", "a\x00b", "\U0001f600 astral", "\ud800 lone", 'é\u2028\n\t"\\'],
    "tuple": (1, "a", None),
    "empty-tuple": (),
    "nested-tuples": ((1, (2, ())), [3, (4,)], {"k": ((),)}),
    "list-of-tuples": [(1, 2), [(), ("x",)]],
    "dict-in-tuple": ({"a": (1,)},),
    "tag-lookalike": {"__tuple__": [1, 2]},
    "dict-lookalike": {"__dict__": [["a", 1]]},
    "tag-lookalike-tuple": {"__tuple__": (1,)},
    "tag-keys-among-others": {"__tuple__": 1, "__dict__": 2, "x": ()},
    "deep": {"a": [{"b": ({"c": [(1.5, "d")]},)}]},
    "key-order": {"z": 1, "a": 2, "m": (3,)},
    "empty": [{}, [], ()],
}


@pytest.mark.parametrize("value", VALUES.values(), ids=list(VALUES))
def test_the_json_codec_round_trips_values_exactly(value: Any) -> None:
    data = JSON.encode_value(value)
    assert type(data) is str and data.isascii()
    assert same(JSON.decode_value(data), value)
    assert same(JSON.decode_value(JSON.canonical_value(value)), value) or type(value) is dict


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_any_json_value_round_trips_with_its_types(value: Any) -> None:
    assert same(JSON.decode_value(JSON.encode_value(value)), value)


def test_canonical_encoding_ignores_key_order_only() -> None:
    one = {"a": 1, "b": {"x": (1,), "y": 2}}
    two = {"b": {"y": 2, "x": (1,)}, "a": 1}
    assert JSON.canonical_value(one) == JSON.canonical_value(two)
    assert JSON.encode_value(one) != JSON.encode_value(two)
    assert JSON.canonical_value({"a": (1,)}) != JSON.canonical_value({"a": [1]})
    assert JSON.canonical_value([1]) != JSON.canonical_value([1.0])


def test_the_json_codec_round_trips_an_execution() -> None:
    exe = Execution(
        id="e\x00\U0001f600",
        definition_id="order",
        status="done",
        outcome={"paid": (12.5, "EUR")},
        active_path=("root", "a", "b"),
        history={"root": ("a", "b"), "x": None},
        context={"items": [("sku", 2)], "n": 0.0},
        version=7,
        parent_id="p",
        child_id="c",
        children={"c1": {"state": ("done",)}, "c2": None},
    )
    back = JSON.decode_execution(JSON.encode_execution(exe))
    assert type(back) is Execution and back is not exe
    back.version = 7
    assert back == exe
    for name in ("outcome", "active_path", "history", "context", "children"):
        assert same(getattr(back, name), getattr(exe, name)), name
    assert "version" not in JSON.encode_execution(exe)


class Color(enum.IntEnum):
    RED = 1


class Pair(NamedTuple):
    a: int
    b: int


class Text(str):
    pass


REFUSED = {
    "set": ({1}, "a set at the top"),
    "object": ([1, {"a": object()}], "a object at [1]['a']"),
    "int-key": ({"a": {1: 2}}, "a dict key 1 (int) at ['a']"),
    "tuple-key": ({("a",): 1}, "a dict key ('a',)"),
    "int-enum": ([Color.RED], "a Color at [0]"),
    "named-tuple": (Pair(1, 2), "a Pair at the top"),
    "str-subclass": ({"k": Text("x")}, "a Text at ['k']"),
    "ordered-dict": (OrderedDict(a=1), "a OrderedDict"),
    "bytes": (b"x", "a bytes"),
    "datetime": (datetime.date(2024, 1, 1), "a date"),
}


@pytest.mark.parametrize(("value", "named"), REFUSED.values(), ids=list(REFUSED))
def test_the_json_codec_refuses_what_it_cannot_round_trip(value: Any, named: str) -> None:
    with pytest.raises(TypeError) as info:
        JSON.encode_value(value)
    assert named in str(info.value)
    assert "codec=" in str(info.value)


def test_cycles_and_depth_are_type_errors() -> None:
    loop: list[Any] = []
    loop.append(loop)
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    for value in (loop, {"a": loop}, deep):
        with pytest.raises(TypeError, match="nested too deeply"):
            JSON.encode_value(value)


def nested(depth: int, kind: Any) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = kind(value)
    return value


@pytest.mark.parametrize(
    "kind", [lambda v: [v], lambda v: (v,), lambda v: {"k": v}], ids=["list", "tuple", "dict"]
)
def test_the_codec_takes_values_nested_to_its_depth_and_refuses_deeper(kind: Any) -> None:
    # The walk counts levels itself: a compiled codec nests in C, past any recursion limit.
    deepest = nested(DEPTH_MAX, kind)
    assert JSON.decode_value(JSON.encode_value(deepest)) == deepest
    with pytest.raises(TypeError, match="nested too deeply"):
        JSON.encode_value(nested(DEPTH_MAX + 1, kind))
    with pytest.raises(TypeError, match="nested too deeply"):
        JSON.encode_execution(Execution(id="e1", context={"v": nested(DEPTH_MAX, kind)}))


def test_an_execution_that_contains_itself_is_a_type_error() -> None:
    exe = Execution(id="e1")
    exe.context["me"] = exe.context
    exe.history["loop"] = [exe.history]
    with pytest.raises(TypeError, match="nested too deeply"):
        JSON.encode_execution(exe)


def test_the_json_codec_encodes_only_its_execution_class() -> None:
    class Mine:
        id = "e1"
        version = 0

    with pytest.raises(TypeError, match="Mine.*codec="):
        JSON.encode_execution(Mine())


def everything(store: Any) -> dict[str, Any]:
    """What a store shows about the executions of these tests."""
    ids = ("e1", "e2")
    return {
        "load": {i: store.load(i) for i in ids},
        "outbox": store.pending_outbox(),
        "spawns": store.pending_spawns(),
        "timers": store.due_timers(math.inf),
        "trace": {i: store.read_trace(i) for i in ids},
        "processed": {i: store.is_processed(i, "v1") for i in ids},
        "stats": store.stats(),
    }


BAD_PARTS = {
    "event": ({"emits": [("t", "ok"), ("t", {1, 2})]}, "the event of emits[1]"),
    "context": ({"spawns": [("c1", "r", {"when": datetime.date.today()})]}, "context of spawns[0]"),
    "root-path": ({"spawns": [("c1", {1}, {})]}, "root_path of spawns[0]"),
    "trace": ({"trace": {"at": object()}}, "the trace step"),
    "trace-key": ({"trace": {1: "a"}}, "the trace step"),
}


@pytest.mark.parametrize(("part", "named"), BAD_PARTS.values(), ids=list(BAD_PARTS))
def test_a_value_the_codec_refuses_is_a_type_error_before_any_write(
    opened: Callable[..., SqliteStore], part: dict[str, Any], named: str
) -> None:
    store = opened()
    store.commit(Execution(id="e1"), [("t", "first")], "v1", [TimerOp("schedule", "p", 1.0)])
    before = everything(store)
    exe = store.load("e1")
    arguments = {"emits": [("t", "fine")], "processed_event_id": "v2", **part}
    with pytest.raises(TypeError) as info:
        store.commit(exe, **arguments, commit_id="k1")
    assert named in str(info.value)
    assert exe.version == 1
    assert everything(store) == before
    # Neither the version, nor a seq, nor the commit id was taken.
    store.commit(exe, [("t", "next")], commit_id="k1")
    assert [e.seq for e in store.pending_outbox()] == [1, 2]


def test_an_execution_the_codec_refuses_is_a_type_error_naming_it(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened()
    exe = Execution(id="e1", context={"when": datetime.date.today()})
    with pytest.raises(TypeError, match=r"execution 'e1'.*\['context'\]\['when'\]"):
        store.commit(exe, [("t", "x")])
    with pytest.raises(TypeError, match="execution 'e1'"):
        store.save(exe)

    class Mine:
        def __init__(self) -> None:
            self.id, self.version = "e2", 0

    with pytest.raises(TypeError, match="codec="):
        store.save(Mine())
    assert exe.version == 0 and store.stats()["executions"] == 0
    assert store.pending_outbox() == []


class ReprRaises:
    """A value whose ``repr`` raises (issue 32, item 10)."""

    def __repr__(self) -> str:
        raise RuntimeError("ReprRaises.__repr__")


class StrRaises(TypeError):
    """A codec's refusal whose ``str`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("StrRaises.__str__")


NAMED_BY_TYPE = r"<ReprRaises instance at 0x[0-9a-f]+> \(ReprRaises\)"


@pytest.mark.parametrize("method", ["encode_value", "canonical_value"])
def test_the_json_codec_names_a_dict_key_whose_repr_raises_by_its_type(method: str) -> None:
    encode = getattr(JSON, method)
    with pytest.raises(TypeError, match=f"^a dict key {NAMED_BY_TYPE} at the top is not a JSON"):
        encode({ReprRaises(): 1})
    with pytest.raises(TypeError, match=rf"^a dict key {NAMED_BY_TYPE} at \['a'\]\[1\] is not"):
        encode({"a": [1, {"b": 2, ReprRaises(): 3}]})
    with pytest.raises(TypeError, match=rf"^a dict key {NAMED_BY_TYPE} at \['context'\]"):
        JSON.encode_execution(Execution(id="e1", context={ReprRaises(): 1}))


class RefusingCodec(JsonCodec):
    """Refuses every event with an error whose ``str`` raises."""

    __slots__ = ()

    def encode_value(self, value: Any) -> str:
        if value == "refused":
            raise StrRaises
        return super().encode_value(value)

    def encode_execution(self, exe: Any) -> str:
        if exe.id == "refused":
            raise StrRaises
        return super().encode_execution(exe)


def test_a_codec_refusal_whose_str_raises_is_named_by_its_type() -> None:
    codec = RefusingCodec()
    with pytest.raises(TypeError, match=r"^cannot encode the event of emits\[2\]: <StrRaises>$"):
        _codec.encode_value(codec, "refused", "the event of emits", 2)
    with pytest.raises(TypeError, match=r"^cannot encode the execution 'refused': <StrRaises>$"):
        _codec.encode_execution(codec, Execution(id="refused"), "refused")


@pytest.mark.parametrize(
    ("codec", "call", "says"),
    [
        (None, lambda s: s.commit(Execution(id="e1"), [("t", {ReprRaises(): 1})]), "the event"),
        (None, lambda s: s.commit(Execution(id="e1"), [], trace={ReprRaises(): 1}), "trace step"),
        (
            None,
            lambda s: s.commit(Execution(id="e1"), [], spawns=[("c", "r", {ReprRaises(): 1})]),
            "the context of spawns[0]",
        ),
        (None, lambda s: s.commit(Execution(id="e2", context={ReprRaises(): 1}), []), "'e2'"),
        (None, lambda s: s.save(Execution(id="e2", context={ReprRaises(): 1})), "'e2'"),
        (RefusingCodec(), lambda s: s.commit(Execution(id="e1"), [("t", "refused")]), "emits"),
        (RefusingCodec(), lambda s: s.save(Execution(id="refused")), "'refused'"),
    ],
    ids=["event", "trace", "context", "execution", "save", "codec-event", "codec-execution"],
)
def test_a_refused_commit_whose_value_cannot_be_shown_is_still_the_type_error(
    opened: Callable[..., SqliteStore], codec: Any, call: Any, says: str
) -> None:
    store = opened(codec=codec)
    store.commit(Execution(id="e1"), [("t", "first")], "v1", [TimerOp("schedule", "p", 1.0)])
    before = everything(store)
    with pytest.raises(TypeError, match="^cannot encode ") as info:
        call(store)
    assert says in str(info.value)
    assert "<ReprRaises instance at 0x" in str(info.value) or "<StrRaises>" in str(info.value)
    assert everything(store) == before


class FloatReprRaises(float):
    def __repr__(self) -> str:
        raise RuntimeError("FloatReprRaises.__repr__")


class StrReprRaises(str):
    def __repr__(self) -> str:
        raise RuntimeError("StrReprRaises.__repr__")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"busy_timeout": FloatReprRaises(-1.0)}, "busy_timeout must be a positive number"),
        ({"busy_timeout": FloatReprRaises(1e10)}, "busy_timeout must be at most"),
        ({"synchronous": StrReprRaises("OFF")}, "synchronous must be 'NORMAL' or 'FULL'"),
    ],
    ids=["busy-timeout", "busy-timeout-too-long", "synchronous"],
)
def test_an_option_whose_repr_raises_is_refused_naming_it_by_its_type(
    path: Path, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=f"^{says}.*, got <(Float|Str)ReprRaises instance at 0x"):
        SqliteStore(path, **options)
    assert not path.exists()


def test_a_path_of_a_str_subclass_is_held_as_a_str(tmp_path: Path) -> None:
    with SqliteStore(StrReprRaises(tmp_path / "x.db")) as store:
        assert type(store.path) is str
        assert repr(store) == f"<SqliteStore {str(tmp_path / 'x.db')!r} open>"


@pytest.mark.parametrize(
    ("call", "bad"),
    [
        (lambda s, b: s.commit(Execution(id=b), []), 1),
        (lambda s, b: s.save(Execution(id=b)), ("a",)),
        (lambda s, b: s.commit(Execution(id="e1"), [(b, "ev")]), 2),
        (lambda s, b: s.commit(Execution(id="e1"), [], b), 3),
        (lambda s, b: s.commit(Execution(id="e1"), [], timers=[TimerOp("cancel", b)]), 4),
        (lambda s, b: s.commit(Execution(id="e1"), [], spawns=[(b, "r", {})]), 5),
        (lambda s, b: s.append_trace(b, {}), 6),
        (lambda s, b: s.load(b), 7),
        (lambda s, b: s.is_processed("e1", b), 8),
        (lambda s, b: s.delete_timer("e1", b, 1.0), 9),
        (lambda s, b: s.forget(b), 10),
        (lambda s, b: s.read_trace(b), 11),
    ],
)
def test_ids_are_strs(opened: Callable[..., SqliteStore], call: Any, bad: Any) -> None:
    store = opened()
    with pytest.raises(TypeError, match="must be a str in a durable store"):
        call(store, bad)
    assert store.stats() == dict.fromkeys(store.stats(), 0)


LONE = "a\udcff"  # a str with a lone surrogate: UTF-8, and so SQLite text, cannot hold it


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda s: s.commit(Execution(id=LONE), []), "execution id"),
        (lambda s: s.save(Execution(id=LONE)), "execution id"),
        (lambda s: s.commit(Execution(id="e1"), [("t", 1), (LONE, "ev")]), "emits[1] target_id"),
        (lambda s: s.commit(Execution(id="e1"), [], LONE), "processed_event_id"),
        (
            lambda s: s.commit(Execution(id="e1"), [], timers=[TimerOp("cancel", LONE)]),
            "timers[0].path",
        ),
        (
            lambda s: s.commit(Execution(id="e1"), [], spawns=[(LONE, "r", {})]),
            "spawns[0] child_id",
        ),
        (lambda s: s.commit(Execution(id="e1"), [], commit_id=LONE), "commit_id"),
        (lambda s: s.append_trace(LONE, {}), "execution_id"),
        (lambda s: s.load(LONE), "execution_id"),
        (lambda s: s.is_processed("e1", LONE), "event_id"),
        (lambda s: s.delete_timer("e1", LONE, 1.0), "path"),
        (lambda s: s.forget(LONE), "execution_id"),
        (lambda s: s.read_trace(LONE), "execution_id"),
    ],
)
def test_an_id_sqlite_cannot_hold_is_a_value_error_naming_it(
    opened: Callable[..., SqliteStore], call: Any, named: str
) -> None:
    store = opened()
    store.commit(Execution(id="e1"), [("t", "first")], "v1", [TimerOp("schedule", "p", 1.0)])
    before = everything(store)
    with pytest.raises(ValueError) as info:
        call(store)
    assert str(info.value) == (
        f"SQLite text cannot hold lone surrogates: {named} 'a\\udcff' has '\\udcff' at index 1"
    )
    assert everything(store) == before


def test_a_copy_of_an_id_sqlite_cannot_hold_is_a_value_error(
    opened: Callable[..., SqliteStore],
) -> None:
    src = harel_store.DictStore()
    src.commit(Execution(id="e1"), [("t", 1)])
    src.commit(Execution(id=LONE), [])
    store = opened()
    with pytest.raises(ValueError, match=r"lone surrogates: .* 'a\\udcff' has"):
        harel_store.copy_store(src, store)
    assert store.stats() == dict.fromkeys(store.stats(), 0)


# An id is a key: at most KEY_BYTES_MAX (1,000) bytes of UTF-8, as in every durable store.
LONG = "k" * (KEY_BYTES_MAX + 1)
LONGEST = "k" * KEY_BYTES_MAX


def too_long(named: str, size: int = KEY_BYTES_MAX + 1) -> str:
    return (
        f"{named} is {size:,} bytes in UTF-8; a durable store holds ids of at most "
        f"{KEY_BYTES_MAX:,} bytes"
    )


@pytest.mark.parametrize(
    ("call", "named"),
    KEYED_CALLS,
)
def test_an_id_longer_than_a_key_is_a_value_error_naming_it_and_nothing_is_written(
    opened: Callable[..., SqliteStore], call: Any, named: str
) -> None:
    store = opened()
    store.commit(Execution(id="e1"), [("t", "first")], "v1", [TimerOp("schedule", "p", 1.0)])
    before = everything(store)
    with pytest.raises(ValueError) as info:
        call(store, LONG)
    assert str(info.value) == too_long(named)
    assert everything(store) == before
    call(store, LONGEST)  # a key of the longest length is taken


def test_ids_of_the_longest_length_are_kept_and_found(opened: Callable[..., SqliteStore]) -> None:
    store = opened()
    ids = {part: part[0] * KEY_BYTES_MAX for part in ("exe", "target", "mark", "path", "child")}
    exe = Execution(id=ids["exe"])
    store.save(exe)
    store.commit(
        exe, [(ids["target"], "ev")], ids["mark"], [TimerOp("schedule", ids["path"], 1.0)],
        [(ids["child"], "r", {})], {"step": 1}, commit_id="c" * KEY_BYTES_MAX,
    )  # fmt: skip
    assert store.load(ids["exe"]).version == 2
    assert store.is_processed(ids["exe"], ids["mark"])
    assert [e.target_id for e in store.pending_outbox()] == [ids["target"]]
    assert [e.child_id for e in store.pending_spawns()] == [ids["child"]]
    assert store.due_timers(1.0) == [(ids["exe"], ids["path"], 1.0)]
    store.append_trace(ids["exe"], {"step": 2})
    assert [s["step"] for s in store.read_trace(ids["exe"])] == [1, 2]
    store.delete_timer(ids["exe"], ids["path"], 1.0)
    store.forget(ids["exe"])
    assert store.load(ids["exe"]) is None


@pytest.mark.parametrize("char", ["é", "€", "😀"], ids=["2-bytes", "3-bytes", "4-bytes"])
def test_an_id_is_measured_in_bytes_of_utf8(opened: Callable[..., SqliteStore], char: str) -> None:
    size = len(char.encode("utf-8"))
    fits = char * (KEY_BYTES_MAX // size)
    over = fits + char  # far fewer than 1,000 characters
    store = opened()
    store.commit(Execution(id=fits), [], "v1")
    assert store.is_processed(fits, "v1")
    with pytest.raises(ValueError) as info:
        store.commit(Execution(id=over), [])
    assert str(info.value) == too_long("execution id", len(over) * size)
    assert len(over) < KEY_BYTES_MAX
    assert store.stats()["executions"] == 1


@pytest.mark.parametrize(
    ("fill", "named"),
    [
        (lambda s: s.commit(Execution(id=LONG), []), "the id of an execution to copy"),
        (
            lambda s: s.commit(Execution(id="e2"), [], LONG),
            "the event id of a processed mark to copy",
        ),
        (
            lambda s: s.commit(Execution(id="e2"), [], commit_id=LONG),
            "a commit id to copy",
        ),
        (
            lambda s: s.commit(Execution(id="e2"), [], timers=[TimerOp("schedule", LONG, 1.0)]),
            "the path of a timer to copy",
        ),
        (
            lambda s: s.commit(Execution(id="e2"), [(LONG, "ev")]),
            "the target_id of an outbox entry to copy",
        ),
        (
            lambda s: s.commit(Execution(id="e2"), [], spawns=[(LONG, "r", {})]),
            "the child_id of a spawn intent to copy",
        ),
    ],
)
def test_a_copy_of_an_id_longer_than_a_key_is_a_value_error_with_nothing_written(
    opened: Callable[..., SqliteStore], fill: Any, named: str
) -> None:
    src = harel_store.DictStore()
    src.commit(Execution(id="e1"), [("t", 1)], "v1", trace={"step": 1})
    fill(src)
    store = opened()
    with pytest.raises(ValueError) as info:
        harel_store.copy_store(src, store)
    assert str(info.value) == too_long(named)
    assert store.stats() == dict.fromkeys(store.stats(), 0)


# --- a codec of one's own -------------------------------------------------------------


class Order:
    """An engine's own execution class: slots, a set and a datetime."""

    __slots__ = ("id", "items", "placed", "state", "version")

    def __init__(self, id: str, state: str, items: set[str], placed: datetime.datetime) -> None:
        self.id, self.state, self.items, self.placed = id, state, items, placed
        self.version = 0


class OrderCodec(JsonCodec):
    """Orders as JSON, and events that may hold ``Decimal`` amounts."""

    def encode_execution(self, exe: Any) -> str:
        if type(exe) is not Order:
            raise TypeError(f"OrderCodec encodes orders, not {type(exe).__name__}")
        fields = [exe.id, exe.state, sorted(exe.items), exe.placed.isoformat()]
        return super().encode_value(fields)

    def decode_execution(self, data: str | bytes) -> Order:
        id_, state, items, placed = super().decode_value(data)
        return Order(id_, state, set(items), datetime.datetime.fromisoformat(placed))

    def encode_value(self, value: Any) -> str:
        if type(value) is decimal.Decimal:
            return super().encode_value({"decimal": str(value)})
        return super().encode_value(value)

    def decode_value(self, data: str | bytes) -> Any:
        value = super().decode_value(data)
        if type(value) is dict and list(value) == ["decimal"]:
            return decimal.Decimal(value["decimal"])
        return value


def test_a_codec_of_ones_own(opened: Callable[..., SqliteStore]) -> None:
    codec = OrderCodec()
    assert isinstance(codec, Codec) and isinstance(JSON, Codec)
    store = opened(codec=codec)
    placed = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    order = Order("o-1", "placed", {"book", "pen"}, placed)
    store.commit(order, [("billing", decimal.Decimal("12.50"))], trace={"step": "placed"})
    assert order.version == 1
    back = store.load("o-1")
    assert type(back) is Order and back is not order
    assert (back.id, back.state, back.items, back.placed, back.version) == (
        "o-1",
        "placed",
        {"book", "pen"},
        placed,
        1,
    )
    [entry] = store.pending_outbox()
    assert entry == OutboxEntry(1, "billing", decimal.Decimal("12.50"))
    assert type(entry.event) is decimal.Decimal
    back.state = "paid"
    store.commit(back, [])
    assert opened(codec=codec).load("o-1").state == "paid"
    # The codec is the one place that knows types: this one knows orders only.
    with pytest.raises(TypeError, match="execution 'e1': OrderCodec encodes orders"):
        store.commit(Execution(id="e1"), [])


def test_a_codec_without_its_methods_is_refused(path: Path) -> None:
    class Half:
        def encode_value(self, value: Any) -> str:
            return ""

    for codec in (Half(), object(), "json"):
        with pytest.raises(TypeError, match="codec must have"):
            SqliteStore(path, codec=codec)
    assert not path.exists()


def test_a_codec_class_given_for_an_instance_is_refused(path: Path) -> None:
    for opener in (SqliteStore, AsyncSqliteStore):
        for codec in (JsonCodec, OrderCodec):
            name = codec.__qualname__
            with pytest.raises(TypeError, match=rf"not the class {name}: pass {name}\(\)"):
                opener(path, codec=codec)
    assert not path.exists()


def test_a_codec_must_give_str_or_bytes(opened: Callable[..., SqliteStore]) -> None:
    class Numbers(JsonCodec):
        def encode_value(self, value: Any) -> Any:
            return 42

    class Blobs(JsonCodec):
        def encode_execution(self, exe: Any) -> bytes:
            return super().encode_execution(exe).encode()

        def encode_value(self, value: Any) -> bytes:
            return super().encode_value(value).encode()

    with pytest.raises(TypeError, match="as a int"):
        opened(codec=Numbers()).commit(Execution(id="e1"), [("t", "x")])
    store = opened(codec=Blobs())
    exe = Execution(id="e1", active_path=("a",))
    store.commit(exe, [("t", ("x",))], trace={"n": 1})
    assert store.load("e1") == exe
    assert store.pending_outbox()[0].event == ("x",)
    assert store.read_trace("e1") == [{"n": 1, "index": 0}]


def test_a_replay_with_the_keys_in_another_order_is_the_same_commit(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened()
    store.commit(
        Execution(id="e1"), [("t", {"a": 1, "b": 2})], trace={"x": 1, "y": 2}, commit_id="k"
    )
    retry = Execution(id="e1")
    store.commit(retry, [("t", {"b": 2, "a": 1})], trace={"y": 2, "x": 1}, commit_id="k")
    assert retry.version == 1 and len(store.pending_outbox()) == 1
    with pytest.raises(IdempotencyConflict):
        store.commit(
            Execution(id="e1"), [("t", {"a": 1, "b": 2.0})], trace={"x": 1, "y": 2}, commit_id="k"
        )


# --- what load, reads and the trace hand out --------------------------------------------


def test_every_read_decodes_anew(opened: Callable[..., SqliteStore]) -> None:
    store = opened()
    exe = Execution(id="e1", context={"n": [1]})
    store.commit(exe, [("t", {"k": [1]})], spawns=[("c", ("r",), {"k": [1]})], trace={"k": [1]})
    for read in (
        lambda: store.load("e1"),
        store.pending_outbox,
        store.pending_spawns,
        lambda: store.read_trace("e1"),
    ):
        first, second = read(), read()
        assert first == second and first is not second
    assert store.load("e1").context is not exe.context
    assert store.pending_spawns() == [SpawnEntry(1, "e1", "c", ("r",), {"k": [1]})]
    store.load("e1").context["n"].append(2)
    store.read_trace("e1")[0]["k"].append(2)
    assert store.load("e1").context == {"n": [1]}
    assert store.read_trace("e1") == [{"k": [1], "index": 0}]


def test_the_trace_ring_honours_explicit_indexes_and_a_changed_trace_max(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened(trace_max=3)
    for i in range(5):
        store.append_trace("e1", {"i": i})
    store.append_trace("e1", {"i": 5, "index": 100})
    store._record_trace("e1", {"i": 6})
    assert store.read_trace("e1") == [
        {"i": 4, "index": 4},
        {"i": 5, "index": 100},
        {"i": 6, "index": 6},
    ]
    store.trace_max = None
    for i in range(7, 10):
        store.append_trace("e1", {"i": i})
    assert len(store.read_trace("e1")) == 6
    store.trace_max = 2
    assert len(store.read_trace("e1")) == 6, "a change applies at the next append"
    store.append_trace("e1", {"i": 10})
    assert store.read_trace("e1") == [{"i": 9, "index": 9}, {"i": 10, "index": 10}]
    assert store.stats()["trace_steps"] == 2 and store.stats()["traces"] == 1
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error):
            store.trace_max = bad
    assert store.trace_max == 2


def test_due_timers_come_by_fire_at_then_arming_order(opened: Callable[..., SqliteStore]) -> None:
    store = opened()
    exe = Execution(id="e1")
    store.commit(exe, [], timers=[TimerOp("schedule", p, 5.0) for p in ("c", "a", "b")])
    store.commit(exe, [], timers=[TimerOp("schedule", "c", 5.0), TimerOp("schedule", "z", 1.0)])
    assert store.due_timers(5.0) == [
        ("e1", "z", 1.0),
        ("e1", "a", 5.0),
        ("e1", "b", 5.0),
        ("e1", "c", 5.0),
    ]
    assert store.due_timers(4.9) == [("e1", "z", 1.0)]
    store.delete_timer("e1", "a", 4.0)
    store.delete_timer("e1", "a", 5)  # the int 5 is the armed 5.0
    assert [path for _, path, _ in store.due_timers(math.inf)] == ["z", "b", "c"]
    with pytest.raises(TypeError):
        store.delete_timer("e1", "b", "5.0")


def test_forget_drops_everything_of_the_execution_but_what_relays_owe(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened()
    for eid in ("e1", "e2"):
        store.commit(
            Execution(id=eid),
            [("t", eid)],
            "v1",
            [TimerOp("schedule", "p", 1.0)],
            [("c", "r", {})],
            {"n": 0},
            commit_id="k",
            epoch=5,
        )
        store.append_trace(eid, {"n": 1})
    store.forget("e1")
    store.forget("e1")  # an unknown id is a no-op
    assert store.load("e1") is None and not store.is_processed("e1", "v1")
    assert store.read_trace("e1") == [] and store.due_timers(math.inf) == [("e2", "p", 1.0)]
    assert [e.event for e in store.pending_outbox()] == ["e1", "e2"]
    assert [s.parent_id for s in store.pending_spawns()] == ["e1", "e2"]
    assert store.stats() == {
        "executions": 1,
        "outbox": 2,
        "spawns": 2,
        "timers": 1,
        "processed": 1,
        "traces": 1,
        "trace_steps": 2,
    }
    again = Execution(id="e1")
    store.commit(again, [], trace={"n": 2}, commit_id="k", epoch=0)  # id and epoch dropped
    assert again.version == 1
    assert store.read_trace("e1") == [{"n": 2, "index": 0}], "the trace index was dropped"
    assert store.read_trace("e2")[-1]["index"] == 1


def test_integers_beyond_64_bits_are_refused_before_any_write(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened()
    store.commit(Execution(id="e1"), [("t", "x")])
    with pytest.raises(ValueError, match="64-bit"):
        store.commit(Execution(id="e2", version=2**63), [("t", "y")])
    with pytest.raises(ValueError, match="64-bit"):
        store.save(store.load("e1"), epoch=2**64)
    store.ack_outbox(2**64)  # no seq of the store: a no-op, as any unknown seq
    store.ack_spawn(-(2**70))
    assert [e.event for e in store.pending_outbox()] == ["x"]
    assert store.load("e1").version == 1 and store.load("e2") is None
    # Big values inside an execution or an event are the codec's: JSON holds them.
    exe = Execution(id="e3", context={"big": 2**100})
    store.commit(exe, [("t", -(2**200))])
    assert store.load("e3").context == {"big": 2**100}
    assert store.pending_outbox()[-1].event == -(2**200)


# --- the schema --------------------------------------------------------------------------


def tables(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        names = sorted(n for (n,) in conn.execute("SELECT name FROM sqlite_master"))
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        return {"names": names, "journal_mode": mode}
    finally:
        conn.close()


def test_the_schema_is_created_on_first_open_and_versioned(path: Path) -> None:
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    with SqliteStore(path) as store:
        store.commit(Execution(id="e1"), [])
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM harel_store_schema").fetchall() == [
            (SCHEMA_VERSION,)
        ]
    finally:
        conn.close()
    shape = tables(path)
    assert shape["journal_mode"] == "wal"
    for name in ("executions", "outbox", "spawns", "processed", "timers", "trace", "commit_ids"):
        assert name in shape["names"]
    with SqliteStore(path) as again:  # opening an existing database changes nothing
        assert again.load("e1").version == 1
    assert tables(path) == shape


def refused_unchanged(path: Path, match: str) -> None:
    before = path.read_bytes()
    for opener in (SqliteStore, AsyncSqliteStore):
        with pytest.raises(StoreError, match=match):
            if opener is SqliteStore:
                SqliteStore(path)
            else:

                async def main() -> None:
                    async with AsyncSqliteStore(path):
                        pass

                asyncio.run(main())
    assert path.read_bytes() == before, "a refused database was changed"
    assert not Path(f"{path}-wal").exists()


def test_a_foreign_database_is_refused_unchanged(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    refused_unchanged(path, "not a harel_store database.*users")
    assert tables(path)["journal_mode"] == "delete"


def test_a_newer_schema_is_refused_unchanged(path: Path) -> None:
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("UPDATE harel_store_schema SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    refused_unchanged(path, f"schema version {SCHEMA_VERSION + 1}, newer")


# A row the schema made and needs, missing or malformed: each as the SQL that damages it,
# and what the refusal says the table holds.
DAMAGED_ROWS = {
    "version-twice": (
        f"INSERT INTO harel_store_schema VALUES ({SCHEMA_VERSION})", "harel_store_schema",
        f"({SCHEMA_VERSION},), ({SCHEMA_VERSION},)",
    ),
    "version-lost": ("DELETE FROM harel_store_schema", "harel_store_schema", ""),
    "version-text": ("UPDATE harel_store_schema SET version = 'one'", "harel_store_schema", "('one',)"),
    "version-negative": ("UPDATE harel_store_schema SET version = -1", "harel_store_schema", "(-1,)"),
    "work-lost": ("DELETE FROM work", "work", ""),
    "work-text": ("UPDATE work SET n = 'many'", "work", "('many',)"),
    "work-real": ("UPDATE work SET n = 1.5", "work", "(1.5,)"),
}  # fmt: skip


@pytest.mark.parametrize(("damage", "table", "held"), DAMAGED_ROWS.values(), ids=list(DAMAGED_ROWS))
def test_a_row_the_schema_needs_missing_or_malformed_is_refused_unchanged(
    path: Path, damage: str, table: str, held: str
) -> None:
    with SqliteStore(path) as store:
        store.commit(Execution(id="e1"), [("t", "kept")])
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute(damage)
    conn.commit()
    conn.close()
    refused_unchanged(
        path,
        re.escape(
            f"{str(path)!r}: the harel_store database is damaged: its {table} table holds "
            f"[{held}], not one "
        )
        + r"(version|counter); nothing was changed$",
    )


def test_a_work_counter_lost_while_open_is_a_store_error(path: Path) -> None:
    def lose_it() -> None:
        conn = sqlite3.connect(path)
        conn.execute("DELETE FROM work")
        conn.commit()
        conn.close()

    with SqliteStore(path) as store:
        lose_it()
        with pytest.raises(StoreError, match="damaged: its work table holds"):
            store.wait_for_work(0.0)
    path.unlink()

    async def main() -> None:
        async with AsyncSqliteStore(path) as astore:
            lose_it()
            await astore.wait_for_work(0.0)

    with pytest.raises(StoreError, match="damaged: its work table holds"):
        asyncio.run(main())


@pytest.mark.parametrize("lost", ["work", "trace", "timers_by_fire_at", "every table"])
def test_a_database_that_lost_part_of_its_schema_is_refused_unchanged(
    path: Path, lost: str
) -> None:
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    names = [lost]
    if lost == "every table":
        tables_ = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        names = [n for (n,) in conn.execute(tables_)]
        names.remove("harel_store_schema")
    for name in names:
        kind = "INDEX" if name.startswith("timers_by") else "TABLE"
        conn.execute(f"DROP {kind} {name}")
    conn.commit()
    conn.close()
    refused_unchanged(path, "damaged: it lacks")
    assert tables(path)["journal_mode"] == "delete"


def test_a_file_that_is_not_a_database_is_refused_unchanged(path: Path) -> None:
    path.write_bytes(b"order ledger, not SQLite\n" * 200)
    refused_unchanged(path, "cannot open")


def test_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open"):
        SqliteStore(tmp_path / "no" / "such" / "dir.db")


def test_an_older_schema_is_migrated(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harel_store.sqlite._schema as module

    with SqliteStore(path) as store:
        store.commit(Execution(id="e1"), [("t", "kept")])
    later = [*MIGRATIONS, ("CREATE TABLE later_feature (x INTEGER)",)]
    monkeypatch.setattr(module, "MIGRATIONS", later)
    monkeypatch.setattr(module, "SCHEMA_VERSION", len(later))
    with SqliteStore(path) as store:
        assert store.load("e1").version == 1
        assert [e.event for e in store.pending_outbox()] == ["kept"]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM harel_store_schema").fetchall() == [(len(later),)]
        assert conn.execute("SELECT count(*) FROM later_feature").fetchone() == (0,)
    finally:
        conn.close()
    monkeypatch.undo()
    with pytest.raises(StoreError, match="newer"):
        SqliteStore(path)


# --- reopening -------------------------------------------------------------------------


def test_reopening_keeps_everything(path: Path) -> None:
    with SqliteStore(path, trace_max=3) as store:
        exe = Execution(id="e1", active_path=("a", "b"))
        store.commit(
            exe,
            [("t", "a"), ("t", "b")],
            "v1",
            [TimerOp("schedule", "p", 2.0), TimerOp("schedule", "q", 1.0)],
            [("c1", "r", {"x": (1,)})],
            {"step": 0},
            commit_id="k1",
            epoch=4,
        )
        for i in range(1, 5):
            store.append_trace("e1", {"step": i})
        for entry in store.pending_outbox():
            store.ack_outbox(entry.seq)
        for entry in store.pending_spawns():
            store.ack_spawn(entry.seq)
        stats = store.stats()

    with SqliteStore(path, trace_max=3) as store:
        assert store.stats() == stats
        loaded = store.load("e1")
        assert loaded == exe and loaded.active_path == ("a", "b")
        assert store.is_processed("e1", "v1") and not store.is_processed("e1", "v2")
        assert store.due_timers(math.inf) == [("e1", "q", 1.0), ("e1", "p", 2.0)]
        # seqs go on from where they were, never reusing an acked one
        store.commit(loaded, [("t", "c")], spawns=[("c2", "r", {})])
        assert [e.seq for e in store.pending_outbox()] == [3]
        assert [e.seq for e in store.pending_spawns()] == [2]
        # the trace index goes on too
        store.append_trace("e1", {"step": 5})
        assert [s["index"] for s in store.read_trace("e1")] == [3, 4, 5]
        # the commit id is recognised, and the epoch fences
        retry = Execution(id="e1")
        store.commit(
            retry,
            [("t", "a"), ("t", "b")],
            "v1",
            [TimerOp("schedule", "p", 2.0), TimerOp("schedule", "q", 1.0)],
            [("c1", "r", {"x": (1,)})],
            {"step": 0},
            commit_id="k1",
            epoch=4,
        )
        assert retry.version == 1
        with pytest.raises(IdempotencyConflict):
            store.commit(store.load("e1"), [], commit_id="k1")
        with pytest.raises(StaleWriter) as info:
            store.save(store.load("e1"), epoch=3)
        assert info.value.current == 4


def test_a_fresh_database_starts_at_seq_one_and_a_refused_commit_takes_none(
    opened: Callable[..., SqliteStore],
) -> None:
    store = opened()
    exe = Execution(id="e1")
    store.commit(exe, [("t", 1)], spawns=[("c", "r", {})])
    with pytest.raises(StoreConflict):
        store.commit(Execution(id="e1"), [("t", 2)], spawns=[("c", "r", {})])
    store.commit(exe, [("t", 3)], spawns=[("c", "r", {})])
    assert [e.seq for e in store.pending_outbox()] == [1, 2]
    assert [e.seq for e in store.pending_spawns()] == [1, 2]


def test_wait_for_work_counts_from_when_the_object_was_opened(
    opened: Callable[..., SqliteStore],
) -> None:
    writer = opened()
    writer.commit(Execution(id="e1"), [("t", "x")])
    late = opened()
    assert late.wait_for_work(0) is False, "work committed before it was opened"
    assert writer.wait_for_work(0) is True, "its own commit counts"
    assert writer.wait_for_work(0) is False
    exe = writer.load("e1")
    writer.save(exe)
    writer.commit(exe, [], "v1", [TimerOp("cancel", "p")], trace={"n": 1})
    assert late.wait_for_work(0.05) is False, "no entry, no armed timer: no work"
    writer.commit(exe, [], timers=[TimerOp("schedule", "p", 1.0)])
    assert late.wait_for_work(0) is True and late.wait_for_work(0) is False
    writer.commit(exe, [], spawns=[("c", "r", {})])
    start = time.monotonic()
    assert late.wait_for_work(10) is True
    assert time.monotonic() - start < 1.0
    start = time.monotonic()
    assert late.wait_for_work(0.1) is False
    assert 0.09 < time.monotonic() - start < 2.0
    for bad, error in (
        (-1, ValueError),
        (math.nan, ValueError),
        ("1", TypeError),
        (None, TypeError),
    ):
        with pytest.raises(error):
            late.wait_for_work(bad)


def test_wait_for_work_wakes_on_another_threads_commit(opened: Callable[..., SqliteStore]) -> None:
    waiter, writer = opened(), opened()
    timer = threading.Timer(0.2, lambda: writer.commit(Execution(id="e1"), [("t", "x")]))
    timer.start()
    try:
        start = time.monotonic()
        assert waiter.wait_for_work(20) is True
        assert time.monotonic() - start < 5.0
    finally:
        timer.join()


# --- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "level"), [("NORMAL", 1), ("FULL", 2), ("full", 2), ("Normal", 1)]
)
def test_synchronous(opened: Callable[..., SqliteStore], given: str, level: int) -> None:
    store = opened(synchronous=given)
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == level
    store.commit(Execution(id="e1"), [("t", "x")])
    assert opened().load("e1").version == 1


def test_the_connection_keeps_statement_journals_in_memory_and_a_larger_wal(
    opened: Callable[..., SqliteStore], path: Path
) -> None:
    from harel_store.sqlite._schema import WAL_AUTOCHECKPOINT

    store = opened()
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_AUTOCHECKPOINT > 1000
    exes = [Execution(id=f"e{i}") for i in range(50)]
    for n in range(100):  # about 3,600 pages of WAL: past SQLite's default of 1,000
        store.commit_many([Commit(e, [("t", {"n": n})], f"m{n}", trace={"n": n}) for e in exes])
    pages = os.path.getsize(f"{path}-wal") // conn.execute("PRAGMA page_size").fetchone()[0]
    assert 1000 < pages <= WAL_AUTOCHECKPOINT + 300, pages


def test_a_lock_held_past_busy_timeout_is_a_store_error_with_nothing_written(
    opened: Callable[..., SqliteStore], path: Path
) -> None:
    store = opened(busy_timeout=0.05)
    exe = Execution(id="e1")
    store.commit(exe, [("t", 1)])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer that keeps the lock
    try:
        calls = {
            "commit": lambda: store.commit(exe, [("t", 2)]),
            "save": lambda: store.save(exe),
            "ack_outbox": lambda: store.ack_outbox(1),
            "claim_outbox": lambda: store.claim_outbox(),
            "append_trace": lambda: store.append_trace("e1", {"step": 1}),
            "forget": lambda: store.forget("e1"),
        }
        for name, call in calls.items():
            with pytest.raises(StoreError, match="stayed locked"):
                call()
            assert exe.version == 1, name
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [e.event for e in store.pending_outbox()] == [1]
    store.commit(exe, [("t", 2)])
    assert exe.version == 2 and store.load("e1").version == 2


def test_a_write_the_database_refuses_is_a_store_error_with_nothing_written(
    opened: Callable[..., SqliteStore],
) -> None:
    """A file the process may read but not write, a damaged file, a full disk: the
    driver's error, from a statement inside the transaction or from its ``BEGIN``, is a
    ``StoreError`` that chains it, and the transaction is rolled back."""
    store = opened()
    exe = Execution(id="e1")
    store.commit(exe, [("t", 1)], "v1", [TimerOp("schedule", "p", 1.0)], trace={"n": 1})
    before = everything(store)
    calls = {
        "save": lambda: store.save(exe),
        "commit": lambda: store.commit(exe, [("t", 2)], "v2", spawns=[("c1", "r", {})]),
        "ack_outbox": lambda: store.ack_outbox(1),
        "claim_outbox": lambda: store.claim_outbox(),
        "claim_due_timers": lambda: store.claim_due_timers(5.0),
        "delete_timer": lambda: store.delete_timer("e1", "p", 1.0),
        "append_trace": lambda: store.append_trace("e1", {"n": 2}),
        "forget": lambda: store.forget("e1"),
    }
    writes = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}

    def refuse_but_executions(action: int, table: str | None, *_: Any) -> int:
        if action in writes and table != "executions":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    # A commit and a forget write the executions table, then fail on the next one.
    store._conn.set_authorizer(refuse_but_executions)
    for name, call in calls.items():
        if name == "save":  # it writes the executions table only
            continue
        with pytest.raises(StoreError, match="failed, nothing was written: not author") as info:
            call()
        assert isinstance(info.value.__cause__, sqlite3.DatabaseError), name
        assert exe.version == 1, name
    store._conn.set_authorizer(None)
    store._conn.execute("PRAGMA query_only = ON")  # now BEGIN IMMEDIATE fails
    for name, call in calls.items():
        with pytest.raises(StoreError, match="nothing was written: attempt to write a readonly"):
            call()
        assert exe.version == 1, name
    store._conn.execute("PRAGMA query_only = OFF")
    assert everything(store) == before
    store.commit(exe, [("t", 2)])
    assert exe.version == 2 and opened().load("e1").version == 2


def test_a_read_the_database_refuses_is_a_store_error(opened: Callable[..., SqliteStore]) -> None:
    store = opened()
    store.commit(Execution(id="e1"), [("t", 1)])
    calls = {
        "load": lambda: store.load("e1"),
        "is_processed": lambda: store.is_processed("e1", "v1"),
        "pending_outbox": store.pending_outbox,
        "pending_spawns": store.pending_spawns,
        "due_timers": lambda: store.due_timers(1.0),
        "read_trace": lambda: store.read_trace("e1"),
        "stats": store.stats,
        "wait_for_work": lambda: store.wait_for_work(0),
        "copy_store": lambda: harel_store.copy_store(store, harel_store.DictStore()),
    }
    store._conn.set_authorizer(
        lambda action, *_: (
            sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_SELECT else sqlite3.SQLITE_OK
        )
    )
    for name, call in calls.items():
        with pytest.raises(
            StoreError, match="reading the SQLite database .* not authorized"
        ) as info:
            call()
        assert isinstance(info.value.__cause__, sqlite3.DatabaseError), name
    store._conn.set_authorizer(None)
    assert store.load("e1").version == 1


READ_ONLY_CHILD = """
import sqlite3, sys
from harel_store import StoreError
from harel_store.sqlite import SqliteStore

with SqliteStore(sys.argv[1]) as store:
    exe = store.load("e1")
    calls = {
        "commit": lambda: store.commit(exe, [("t", 2)]),
        "save": lambda: store.save(exe),
        "ack_outbox": lambda: store.ack_outbox(1),
        "claim_outbox": lambda: store.claim_outbox(),
        "forget": lambda: store.forget("e1"),
    }
    for name, call in calls.items():
        try:
            call()
        except StoreError as exc:
            assert "readonly" in str(exc), (name, exc)
            assert isinstance(exc.__cause__, sqlite3.OperationalError), (name, exc)
        else:
            raise AssertionError(f"{name} wrote to a read-only file")
        assert exe.version == 1, name
    assert [e.event for e in store.pending_outbox()] == [1]
print("refused")
"""


def test_a_file_it_may_read_but_not_write_is_a_store_error_on_write(path: Path) -> None:
    with SqliteStore(path) as store:
        store.commit(Execution(id="e1"), [("t", 1)])
    path.chmod(0o444)
    command = [sys.executable, "-c", READ_ONLY_CHILD, str(path)]
    if getattr(os, "geteuid", lambda: -1)() == 0:  # root writes any file: drop its capabilities
        command = ["setpriv", "--bounding-set=-all", *command]
        if (
            shutil.which("setpriv") is None
            or subprocess.run([*command[:2], "true"], check=False).returncode
        ):
            pytest.skip("running as root, and setpriv cannot drop the capabilities")
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    finally:
        path.chmod(0o644)
    assert done.stdout.strip() == "refused", done.stderr
    with SqliteStore(path) as store:
        assert store.load("e1").version == 1
        assert [e.event for e in store.pending_outbox()] == [1]


def test_the_default_is_normal_and_wal(opened: Callable[..., SqliteStore]) -> None:
    store = opened()
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"synchronous": "OFF"}, ValueError),
        ({"synchronous": "EXTRA"}, ValueError),
        ({"synchronous": 2}, TypeError),
        ({"trace_max": -1}, ValueError),
        ({"trace_max": "5"}, TypeError),
        ({"busy_timeout": 0}, ValueError),
        ({"busy_timeout": "1"}, TypeError),
        ({"clock": 5}, TypeError),
        ({"bogus": 1}, TypeError),
    ],
    ids=repr,
)
def test_bad_options_are_refused_before_opening(
    path: Path, options: dict[str, Any], error: type[Exception]
) -> None:
    for opener in (SqliteStore, AsyncSqliteStore):
        with pytest.raises(error):
            opener(path, **options)
    assert not path.exists()


def test_a_bad_busy_timeout_is_named_a_number_of_seconds(path: Path) -> None:
    for opener in (SqliteStore, AsyncSqliteStore):
        with pytest.raises(
            TypeError, match="busy_timeout must be a real number of seconds, got str"
        ):
            opener(path, busy_timeout="1")
        with pytest.raises(TypeError, match="got bool"):
            opener(path, busy_timeout=True)


def test_a_busy_timeout_sqlite_cannot_hold_is_refused(path: Path) -> None:
    """SQLite keeps it as an int of milliseconds: a longer one wrapped round to none."""
    most = (2**31 - 1) / 1000
    for opener in (SqliteStore, AsyncSqliteStore):
        for bad in (most + 0.001, 3e6, 1e300, math.inf):
            with pytest.raises(ValueError, match=r"busy_timeout must be at most 2147483\.647 s"):
                opener(path, busy_timeout=bad)
    assert not path.exists()
    with SqliteStore(path, busy_timeout=most) as store:
        assert store._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2**31 - 1


@pytest.mark.parametrize(
    ("bad", "error"),
    [(5, TypeError), (b"x.db", TypeError), ("", ValueError), ("a\0.db", ValueError)],
)
def test_a_bad_path_is_refused(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        SqliteStore(bad)


def test_open_store_routes_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with harel_store.open_store("sqlite:///relative.db", trace_max=5) as store:
        assert type(store) is SqliteStore and store.trace_max == 5
        assert store.path == "relative.db"
        store.commit(Execution(id="e1"), [])
    assert (tmp_path / "relative.db").exists()
    absolute = tmp_path / "absolute.db"
    with harel_store.open_store(f"sqlite:///{absolute}", synchronous="FULL") as store:
        assert store.path == str(absolute)
    with harel_store.open_store("sqlite://") as store:
        assert store.path == ":memory:"
    with pytest.raises(TypeError):
        harel_store.open_store("sqlite://", bogus=1)

    async def main() -> None:
        async with harel_store.open_async_store("sqlite:///relative.db") as astore:
            assert type(astore) is AsyncSqliteStore
            assert (await astore.load("e1")).version == 1

    asyncio.run(main())


def test_a_path_is_a_file_name_never_a_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SQLite built with SQLITE_USE_URI reads a name that starts with 'file:' as a URI:
    'file:orders.db' would be orders.db, 'file::memory:' a private database."""
    monkeypatch.chdir(tmp_path)
    names = ["file:orders.db", "file::memory:", "file:x.db?mode=ro", "100% #1 ünï.db"]
    for name in names:
        with SqliteStore(name) as store:
            assert store.path == name
            store.commit(Execution(id="e1"), [])
        with SqliteStore(name) as store:  # a file, not a private database
            assert store.load("e1").version == 1, name
    for name in ("file:orders.db", "file::memory:"):
        with harel_store.open_store(f"sqlite:///{name}") as store:
            assert store.path == name and store.load("e1").version == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    absolute = tmp_path / "file:absolute.db"
    with SqliteStore(absolute) as store:
        store.commit(Execution(id="e1"), [])
    assert absolute.exists()


def test_a_path_ending_with_a_separator_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "there").mkdir()
    for bad in ("data/", "there/", f"{tmp_path}{os.sep}data{os.sep}"):
        for opener in (SqliteStore, AsyncSqliteStore):
            with pytest.raises(ValueError, match="must name a file, not a directory"):
                opener(bad)
        with pytest.raises(ValueError, match="ends with a separator"):
            harel_store.open_store(f"sqlite:///{bad}")
    assert [p.name for p in tmp_path.iterdir()] == ["there"]
    assert not any((tmp_path / "there").iterdir())


def test_capabilities() -> None:
    for cls in (SqliteStore, AsyncSqliteStore):
        assert cls.durable is True and cls.preserves_identity is False


def test_a_store_cannot_be_copied_or_pickled(path: Path) -> None:
    """A copy would share the original's connection (and the async store's thread):
    closing the copy would close the original's database."""

    async def main() -> None:
        async with AsyncSqliteStore(path) as astore:
            with SqliteStore(path) as store:
                for original in (store, astore):
                    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
                        with pytest.raises(TypeError, match="cannot be copied or pickled"):
                            attempt(original)
                store.commit(Execution(id="e1"), [])
            assert (await astore.load("e1")).version == 1

    asyncio.run(main())


# --- closed stores ---------------------------------------------------------------------

CALLS: dict[str, tuple[Any, ...]] = {
    "load": ("e1",),
    "save": (Execution(id="e1"),),
    "commit": (Execution(id="e1"), []),
    "is_processed": ("e1", "v1"),
    "pending_outbox": (),
    "ack_outbox": (1,),
    "claim_outbox": (),
    "pending_spawns": (),
    "ack_spawn": (1,),
    "claim_spawns": (),
    "due_timers": (1.0,),
    "claim_due_timers": (1.0,),
    "delete_timer": ("e1", "p", 1.0),
    "append_trace": ("e1", {}),
    "read_trace": ("e1",),
    "forget": ("e1",),
    "stats": (),
    "wait_for_work": (0,),
    "_record_trace": ("e1", {}),
}


@pytest.mark.parametrize("memory", [False, True], ids=["file", "memory"])
def test_a_closed_store_raises_value_error(path: Path, memory: bool) -> None:
    store = SqliteStore(":memory:" if memory else path)
    with store as entered:
        assert entered is store
        entered.commit(Execution(id="e1"), [])
    store.close()  # idempotent
    for name, args in CALLS.items():
        with pytest.raises(ValueError, match="closed"):
            getattr(store, name)(*args)
    with pytest.raises(ValueError, match="closed"), store:
        pass
    assert "closed" in repr(store)
    store.trace_max = 5  # an attribute, not a call on the database
    if not memory:
        with SqliteStore(path) as again:
            assert again.load("e1").version == 1


def test_a_closed_async_store_raises_value_error(path: Path) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(path) as store:
            await store.commit(Execution(id="e1"), [])
        await store.close()
        for name, args in CALLS.items():
            with pytest.raises(ValueError, match="closed"):
                if name == "_record_trace":
                    store._record_trace(*args)
                else:
                    await getattr(store, name)(*args)
        with pytest.raises(ValueError, match="closed"):
            async with store:
                pass

    asyncio.run(main())


def test_an_error_in_the_block_propagates_and_closes(path: Path) -> None:
    with pytest.raises(KeyError), SqliteStore(path) as store:
        raise KeyError("x")
    with pytest.raises(ValueError):
        store.load("e1")


# The claims, each handed a store and a lease, giving what it claimed: the seqs, or the
# timers. The caller's now (200) says which timers are due, not the lease clock (100).
LOCKED_CLAIMS: dict[str, Callable[[SqliteStore, float], list[Any]]] = {
    "claim_outbox": lambda store, lease: [e.seq for e in store.claim_outbox(lease=lease)],
    "claim_spawns": lambda store, lease: [e.seq for e in store.claim_spawns(lease=lease)],
    "claim_due_timers": lambda store, lease: store.claim_due_timers(200.0, lease=lease),
}
LOCKED_CLAIMED = {
    "claim_outbox": [1],
    "claim_spawns": [1],
    "claim_due_timers": [("e1", "p", 150.0)],
}


def _one_of_each(store: SqliteStore) -> None:
    store.commit(
        Execution(id="e1"),
        [("t", "x")],
        timers=[TimerOp("schedule", "p", 150.0)],
        spawns=[("c", "r", {})],
    )


@pytest.mark.parametrize("claim", list(LOCKED_CLAIMS))
def test_a_claim_that_waits_for_the_write_lock_times_its_lease_from_when_it_holds_it(
    opened: Callable[..., SqliteStore], path: Path, claim: str
) -> None:
    """The clock runs on while another writer holds the lock: a claim reads it once it
    holds the lock, so its wait takes nothing off the lease, and no other claim gets its
    items while the lease lives."""
    now = [0.0]
    a, b = opened(clock=lambda: now[0]), opened(clock=lambda: now[0])
    _one_of_each(a)
    call = LOCKED_CLAIMS[claim]
    got: list[Any] = []

    def claim_a() -> None:
        try:
            got.append(call(a, 10.0))
        except Exception as exc:  # noqa: BLE001 - shown by the asserts below
            got.append(exc)

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer that keeps the lock
    claimer = threading.Thread(target=claim_a)
    try:
        claimer.start()
        # Once the claimer holds the store object's lock, it has made any clock reading
        # it makes before the write lock, and waits (or is about to) for that lock.
        deadline = time.monotonic() + 30.0
        while a._lock.acquire(blocking=False):
            a._lock.release()
            assert time.monotonic() < deadline and claimer.is_alive(), got
            time.sleep(0.005)
        now[0] = 100.0  # while the lock is held
    finally:
        holder.execute("COMMIT")
        holder.close()
        claimer.join(60.0)
    assert not claimer.is_alive()
    assert got == [LOCKED_CLAIMED[claim]], "the waiting claim got its items"
    assert call(b, 10.0) == [], "a claim right after got the items of a live lease"
    now[0] = 109.5
    assert call(b, 10.0) == [], "the lease ran out early"
    now[0] = 110.0  # the lease was timed from 100: the moment the claim held the lock
    assert call(b, 10.0) == LOCKED_CLAIMED[claim]


@pytest.mark.parametrize("reading", ["raises", math.nan], ids=["raises", "nan"])
@pytest.mark.parametrize("claim", list(LOCKED_CLAIMS))
def test_a_clock_failing_under_the_write_lock_rolls_the_claim_back(
    opened: Callable[..., SqliteStore], path: Path, claim: str, reading: Any
) -> None:
    """The clock is read inside the claim's transaction: a reading that fails, or is
    refused, ends that transaction with nothing leased and the write lock free."""
    readings: list[Any] = [reading]

    def clock() -> float:
        value = readings.pop() if readings else 100.0
        if value == "raises":
            raise RuntimeError("the clock broke")
        return float(value)

    store = opened(clock=clock)
    _one_of_each(store)
    with pytest.raises(RuntimeError if reading == "raises" else ValueError, match="clock"):
        LOCKED_CLAIMS[claim](store, 10.0)
    assert not readings, "the clock was not read"
    assert store._conn is not None and not store._conn.in_transaction
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")  # the write lock is free at once
        other.execute("ROLLBACK")
    finally:
        other.close()
    # nothing was leased: another store object claims the items at once
    assert LOCKED_CLAIMS[claim](opened(clock=lambda: 100.0), 10.0) == LOCKED_CLAIMED[claim]


# --- the async twin ----------------------------------------------------------------------


def test_the_async_store_keeps_the_event_loop_free(path: Path) -> None:
    """A commit that waits for another connection's write lock waits on the store's
    thread; the loop goes on ticking."""
    blocker = sqlite3.connect(path, isolation_level=None)
    SqliteStore(path).close()

    async def main() -> tuple[int, float]:
        async with AsyncSqliteStore(path) as store:
            blocker.execute("BEGIN IMMEDIATE")
            release = asyncio.get_running_loop().call_later(0.5, blocker.execute, "COMMIT")
            ticks = 0
            commit = asyncio.ensure_future(store.commit(Execution(id="e1"), [("t", "x")]))
            start = time.monotonic()
            while not commit.done():
                ticks += 1
                await asyncio.sleep(0.01)
            await commit
            release.cancel()
            assert (await store.load("e1")).version == 1
            return ticks, time.monotonic() - start

    try:
        ticks, waited = asyncio.run(main())
    finally:
        blocker.close()
    assert waited >= 0.4 and ticks >= 10, (ticks, waited)


def test_async_wait_for_work_leaves_the_store_free_for_other_calls(path: Path) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(path) as store:
            waiting = asyncio.ensure_future(store.wait_for_work(20))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            start = time.monotonic()
            await store.commit(Execution(id="e1"), [("t", "x")])  # not stuck behind the wait
            assert time.monotonic() - start < 2.0
            assert await asyncio.wait_for(waiting, 5) is True
            assert await store.wait_for_work(0.05) is False

    asyncio.run(main())


def test_a_cancelled_async_wait_for_work_leaves_the_wake_up_for_the_next(path: Path) -> None:
    """A wait cancelled while its look at the work counter runs on the store's thread
    never returned: the work stays owed to the next wait."""

    async def main() -> None:
        async with AsyncSqliteStore(path) as store:
            with SqliteStore(path) as writer:
                writer.commit(Execution(id="e1"), [("t", "x")])
            lock = store._opening.result()._lock
            lock.acquire()  # the look waits for it on the store's thread
            try:
                waiting = asyncio.ensure_future(store.wait_for_work(20))
                await asyncio.sleep(0.2)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            finally:
                lock.release()
            await asyncio.sleep(0.1)  # the look, done with, finishes on the thread
            assert await store.wait_for_work(5) is True
            assert await store.wait_for_work(0) is False

    asyncio.run(main())


def test_async_wait_for_work_keeps_its_timeout_while_the_thread_is_busy(path: Path) -> None:
    """Another task's commit waits for the write lock on the store's one thread; the
    wait returns False about when its timeout says, and sees the commit once it lands."""
    SqliteStore(path).close()
    blocker = sqlite3.connect(path, isolation_level=None)

    async def main() -> None:
        async with AsyncSqliteStore(path) as store:
            blocker.execute("BEGIN IMMEDIATE")
            release = asyncio.get_running_loop().call_later(5.0, blocker.execute, "COMMIT")
            commit = asyncio.ensure_future(store.commit(Execution(id="e1"), [("t", "x")]))
            await asyncio.sleep(0.1)
            start = time.monotonic()
            assert await store.wait_for_work(0.2) is False
            assert time.monotonic() - start < 1.5
            assert not commit.done()
            release.cancel()
            blocker.execute("COMMIT")
            await commit
            assert await store.wait_for_work(5) is True

    try:
        asyncio.run(main())
    finally:
        blocker.close()


def test_a_cancelled_async_close_still_closes_the_database(path: Path) -> None:
    """The close waits on the store's thread behind a commit that waits for the write
    lock; cancelled meanwhile, it still closes the connection, and a later close()
    waits for that."""
    SqliteStore(path).close()
    blocker = sqlite3.connect(path, isolation_level=None)

    async def main() -> None:
        store = AsyncSqliteStore(path)
        await store.stats()
        inner = store._opening.result()
        blocker.execute("BEGIN IMMEDIATE")
        release = asyncio.get_running_loop().call_later(5.0, blocker.execute, "COMMIT")
        commit = asyncio.ensure_future(store.commit(Execution(id="e1"), [("t", "x")]))
        await asyncio.sleep(0.1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(store.close(), 0.2)
        assert "closed" in repr(store)
        release.cancel()
        blocker.execute("COMMIT")
        await commit
        await asyncio.wait_for(store.close(), 10)
        assert "closed" in repr(inner), "the connection was left open"
        await store.close()
        with pytest.raises(ValueError, match="closed"):
            await store.load("e1")

    try:
        asyncio.run(main())
    finally:
        blocker.close()
    with SqliteStore(path) as again:
        assert again.load("e1").version == 1


def test_the_async_store_opens_on_its_thread(path: Path) -> None:
    path.write_text("not a database")
    store = AsyncSqliteStore(path)  # no error yet: opening happens on the store's thread

    async def main() -> None:
        with pytest.raises(StoreError):
            await store.load("e1")
        with pytest.raises(StoreError):
            await store.commit(Execution(id="e1"), [])
        await store.close()

    asyncio.run(main())


def test_the_async_store_is_the_sync_store_on_a_thread(path: Path) -> None:
    async def main() -> None:
        async with AsyncSqliteStore(path, trace_max=2) as store:
            exe = Execution(id="e1")
            await store.commit(exe, [("t", "a")], "v1", [TimerOp("schedule", "p", 1.0)], trace={})
            assert exe.version == 1
            store.trace_max = 1
            assert store.trace_max == 1
            await store.append_trace("e1", {"n": 1})
            assert await store.read_trace("e1") == [{"n": 1, "index": 1}]
            assert await store.is_processed("e1", "v1")
            assert [e.event for e in await store.claim_outbox()] == ["a"]
            assert await store.claim_due_timers(5.0) == [("e1", "p", 1.0)]
            assert (await store.stats())["timers"] == 1
            with pytest.raises(StoreConflict):
                await store.commit(Execution(id="e1"), [])
            with pytest.raises(TypeError):
                await store.commit(Execution(id="e1"), [("t", {1})])
            await store.forget("e1")
            assert await store.load("e1") is None

    asyncio.run(main())
    with SqliteStore(path) as store:
        assert store.pending_outbox()[0].event == "a"


# --- indexes: costs that do not grow with the database --------------------------------------


def bulk_fill(store: SqliteStore, n: int) -> None:
    """``n`` executions, each with a pending outbox entry and spawn, a processed mark, a
    timer far in the future and a trace step: written in one transaction, straight into
    the store's tables (the API would take a commit each)."""
    conn = store._conn
    blob = JSON.encode_execution(Execution(id="x", definition_id="order", context={"n": 1}))
    ids = [f"bulk-{i}" for i in range(n)]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO executions (id, version, body) VALUES (?, 1, ?)", [(i, blob) for i in ids]
    )
    conn.executemany(
        "INSERT INTO outbox (target_id, event) VALUES (?, '\"ev\"')", [(i,) for i in ids]
    )
    conn.executemany(
        "INSERT INTO spawns (parent_id, child_id, root_path, context) VALUES (?, 'c', '\"r\"', '{}')",
        [(i,) for i in ids],
    )
    conn.executemany(
        "INSERT INTO processed (execution_id, event_id) VALUES (?, 'ev')", [(i,) for i in ids]
    )
    conn.executemany(  # seq: arming order, from the work counter (moved past it below)
        "INSERT INTO timers (execution_id, path, fire_at, seq)"
        " VALUES (?, 'p', ?, (SELECT n FROM work) + ?)",
        [(i, 1e9 + k, k + 1) for k, i in enumerate(ids)],
    )
    conn.execute("UPDATE work SET n = n + ?", (n + 1,))
    conn.executemany(
        "INSERT INTO trace (execution_id, idx, step) VALUES (?, 0, '{}')", [(i,) for i in ids]
    )
    conn.executemany("INSERT INTO trace_index VALUES (?, 1)", [(i,) for i in ids])
    conn.execute("COMMIT")


def best_cpu(func: Callable[[], Any], repeat: int = 7, number: int = 20) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            func()
        best = min(best, time.process_time() - start)
    return best / number


def costs(store: SqliteStore) -> dict[str, float]:
    """CPU seconds per call of the operations that must not grow with the database."""
    exe = store.load("probe") or Execution(id="probe")
    store.commit(exe, [], timers=[TimerOp("schedule", f"due-{i}", float(i)) for i in range(10)])

    def sweep() -> None:
        due = store.due_timers(100.0)
        assert len(due) == 10

    def claim_timers() -> None:
        assert len(store.claim_due_timers(100.0, 10, lease=0.0)) == 10

    def claim_outbox() -> None:
        assert len(store.claim_outbox(10, lease=0.0)) == 10

    def claim_spawns() -> None:
        assert len(store.claim_spawns(10, lease=0.0)) == 10

    def commit() -> None:
        store.commit(exe, [], "v", [TimerOp("schedule", "due-0", 0.0)], trace={"n": 1})

    def reads() -> None:
        store.load("probe")
        store.is_processed("probe", "v")
        store.read_trace("probe")

    return {
        "sweep": best_cpu(sweep),
        "claim_due_timers": best_cpu(claim_timers),
        "claim_outbox": best_cpu(claim_outbox),
        "claim_spawns": best_cpu(claim_spawns),
        "commit": best_cpu(commit),
        "reads": best_cpu(reads),
    }


def test_operations_cost_the_same_on_1k_and_50k_executions(tmp_path: Path) -> None:
    small = SqliteStore(tmp_path / "small.db")
    large = SqliteStore(tmp_path / "large.db")
    try:
        bulk_fill(small, 1_000)
        bulk_fill(large, 50_000)
        assert large.stats()["timers"] == 50_000
        for _ in range(3):  # a busy machine can spoil one measurement, not every one
            few, many = costs(small), costs(large)
            slower = {op: many[op] / max(few[op], 1e-6) for op in few}
            if all(many[op] < 4 * few[op] + 0.0005 for op in few):
                break
        for op in few:
            assert many[op] < 4 * few[op] + 0.0005, (
                f"{op}: {many[op] * 1e6:.0f} us on 50k executions, {few[op] * 1e6:.0f} us on 1k "
                f"({slower[op]:.1f}x)"
            )
    finally:
        small.close()
        large.close()
