"""The default codec's bytes and digests do not move: stored rows and the SHA-256 of
replayed commit ids depend on them. Golden values (computed by a23eb64, before the
tagging walk was made cheaper), a plain reference encoder, and the rows the SQLite store
writes through its direct path and through the codec's named path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harel_store import Commit, Execution, TimerOp
from harel_store._codec import JSON, JsonCodec, plain_values
from harel_store._digest import body_digest
from harel_store.sqlite import SqliteStore

VALUES: list[Any] = [
    {"type": "shipped", "order": 7},
    {"event": "ship", "actions": ("notify", ("a", [1, 2.5])), "context_out": {"state": "shipped"}},
    {"__tuple__": (1,), "x": {"__dict__": [()]}},
    {"__dict__": {"__tuple__": ()}},
    [(), [], {}, {"": None}, float("nan"), float("inf"), -0.0, 10**20, True],
    "caf\u00e9 \ud800 \U0001f600 \x00",
    ("root", {"k": ("v",)}),
]
ENCODED = [
    "0abb9516284d40a4d7ed030f81d23201",
    "7148c11f3d838e9021572947fcceba69",
    "1cd38fff98b7f982b2601c14fb6ef525",
    "32dd0c45b64cd660c85727794920b152",
    "f14e2973973d9a806f811b6230207f84",
    "2ebe129bd833c81a74fab51a2c16405f",
    "38105bd31a10deaef49227542379ae30",
]
CANONICAL = ["4df4651d6e023b6a712f005fcde96323", "9f42f717516c858ef6d55b05e0326db6", *ENCODED[2:]]
EXECUTION = "2567efc59542938b17e5ed425c17081e"
BODY = "d179f412161b29a5d58097d7abfc1f49b27d4555f40c8e25162827297cfbf36a"


def _h(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _exe() -> Execution:
    return Execution(
        id="exe-0",
        definition_id="order",
        active_path=("root", "a"),
        history={"root": ("a", "b")},
        context={"n": [1, (2,)], "__tuple__": 3},
        children={"c": "d"},
    )


def _body() -> tuple[Any, ...]:
    return (
        (("exe-1", VALUES[0]), (None, VALUES[1])),
        "evt-1",
        (TimerOp("schedule", "root/wait", 12.5), TimerOp("cancel", "root/x", None)),
        (("exe-0/pay", "root/fulfil/pay", VALUES[2]),),
        {"event": "ship", "actions": ("notify",)},
    )


def test_golden_bytes() -> None:
    assert [_h(JSON.encode_value(v)) for v in VALUES] == ENCODED
    assert [_h(JSON.canonical_value(v)) for v in VALUES] == CANONICAL
    assert _h(JSON.encode_execution(_exe())) == EXECUTION
    assert body_digest(JSON.canonical_value, _body()).hex() == BODY


def _ref_tag(v: Any) -> Any:
    if v is None or type(v) in (str, int, float, bool):
        return v
    if type(v) is tuple:
        return {"__tuple__": [_ref_tag(x) for x in v]}
    if type(v) is list:
        return [_ref_tag(x) for x in v]
    assert type(v) is dict
    if len(v) == 1 and ("__tuple__" in v or "__dict__" in v):
        return {"__dict__": [[k, _ref_tag(x)] for k, x in v.items()]}
    return {k: _ref_tag(x) for k, x in v.items()}


def _ref(v: Any, sort_keys: bool = False) -> str:
    return json.dumps(_ref_tag(v), separators=(",", ":"), sort_keys=sort_keys)


KEYS = st.sampled_from(["a", "b", "__tuple__", "__dict__", "", "\u00e9"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(KEYS, inner, max_size=3)
    ),
    max_leaves=12,
)


@given(JSONISH)
def test_the_codec_writes_what_a_plain_encoder_writes(value: Any) -> None:
    assert JSON.encode_value(value) == _ref(value)
    assert JSON.canonical_value(value) == _ref(value, sort_keys=True)
    exe = Execution(id="e", definition_id="d", context={"v": value}, active_path=(value,))
    fields = {name: getattr(exe, name) for name in _FIELDS}
    assert JSON.encode_execution(exe) == _ref(fields)


# The execution's fields in their declared order, but the version (kept in its own column).
_FIELDS = tuple(f.name for f in dataclasses.fields(Execution) if f.name != "version")


class _Subclass(JsonCodec):
    __slots__ = ()


class _OwnValues(JsonCodec):
    """encode_value overridden with the same text: the store takes the codec's named path."""

    __slots__ = ()

    def encode_value(self, value: Any) -> str:
        return JsonCodec.encode_value(self, value)


def test_which_codecs_take_the_direct_path() -> None:
    assert plain_values(JSON) and plain_values(_Subclass())
    assert not plain_values(_OwnValues())


def _rows(path: Path) -> list[Any]:
    with closing(sqlite3.connect(path)) as conn:  # a connection's own `with` leaves it open
        return [
            conn.execute("SELECT target_id, event FROM outbox ORDER BY seq").fetchall(),
            conn.execute("SELECT root_path, context FROM spawns ORDER BY seq").fetchall(),
            conn.execute("SELECT step FROM trace ORDER BY idx").fetchall(),
            conn.execute("SELECT body FROM executions WHERE id = 'exe-0'").fetchall(),
            conn.execute("SELECT digest FROM commit_ids").fetchall(),
        ]


@pytest.mark.parametrize("codec", [None, _Subclass(), _OwnValues()], ids=["json", "sub", "own"])
def test_sqlite_rows_are_the_codec_texts(tmp_path: Path, codec: Any) -> None:
    emits, mark, timers, spawns, trace = _body()
    with SqliteStore(tmp_path / "db", codec=codec) as store:
        store.commit(_exe(), emits, mark, timers, spawns, trace, commit_id="c-1")
        store.commit_many([Commit(Execution(id="exe-9", definition_id="d"), emits, "evt-2")])
    outbox, born, steps, bodies, digests = _rows(tmp_path / "db")
    events = [JSON.encode_value(event) for _, event in emits]
    assert outbox == [(target, text) for (target, _), text in zip(emits, events)] * 2
    assert born == [(JSON.encode_value("root/fulfil/pay"), JSON.encode_value(VALUES[2]))]
    assert steps == [(JSON.encode_value(trace),)]
    assert bodies == [(JSON.encode_execution(_exe()),)]
    assert digests == [(bytes.fromhex(BODY),)]


def test_a_refused_value_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "db") as store:
        exe = Execution(id="e", definition_id="d")
        spawns = [("c", "root", {"ok": 1}), ("c2", "root", {"bad": ({1},)})]
        with pytest.raises(TypeError, match=r"^cannot encode the context of spawns\[1\]: a set"):
            store.commit(exe, [("t", {"a": (1,)})], spawns=spawns)
        with pytest.raises(TypeError, match=r"commits\[1\].*the trace step"):
            store.commit_many(
                [
                    Commit(Execution(id="f", definition_id="d"), [], trace={"a": 1}),
                    Commit(exe, [], trace={"a": [object()]}),
                ]
            )
        assert store.load("e") is None and store.load("f") is None
        assert store.pending_outbox() == [] and store.pending_spawns() == []
