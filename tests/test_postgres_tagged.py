"""The PostgreSQL commit's one-walk encoding for the default codec (postgres/_tagged.py)
writes the bytes and digests the codec's own methods write: a replay is recognised
against a digest stored by the codec path, and the codec path's errors are kept."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest

from harel_store import Execution, IdempotencyConflict, TimerOp
from harel_store._checks import commit_body
from harel_store._codec import JSON, JsonCodec
from harel_store._digest import body_digest
from harel_store.postgres import PostgresStore
from harel_store.postgres._statements import _pack
from harel_store.postgres._tagged import encode_body, is_plain_json

VALUES: list[Any] = [
    {"type": "shipped", "order": 7},
    {"z": 1, "a": {"y": [1, (2, 3)], "b": None}, "m": 1.5},
    {"__tuple__": [1, 2]},
    {"__dict__": {"b": 1, "a": 2}},
    (1, "two", (3.0, None), {"k": (True, False)}),
    ["é\u2028\U0001f600\ud800\x00", math.nan, -math.inf, 10**30, -0.0],
    "plain",
    [],
    {},
]


def bodies() -> list[Any]:
    out = []
    for i, value in enumerate(VALUES):
        other = VALUES[-1 - i]
        out.append(
            commit_body(
                [("t-1", value), (None, other)],
                None if i % 2 else f"ev-{i}",
                [TimerOp("schedule", "b", 1.25 + i), TimerOp("cancel", "a\u00e9", None)],
                [("c-1", value, {"ctx": other, "a": value})] if i % 3 else (),
                None if i % 4 == 1 else {"step": value, "event": "e", "actions": [other]},
                str_ids=True,
            )
        )
    return out


@pytest.mark.parametrize("body", bodies())
def test_the_one_walk_writes_what_the_codec_writes(body: Any) -> None:
    encoded = encode_body(body, True)
    assert encoded is not None
    events, roots, contexts, step, digest = encoded
    assert events == [_pack(JSON.encode_value(event)) for _, event in body.emits]
    assert roots == [_pack(JSON.encode_value(root)) for _, root, _ in body.spawns]
    assert contexts == [_pack(JSON.encode_value(context)) for _, _, context in body.spawns]
    assert step == ([] if body.trace is None else [_pack(JSON.encode_value(body.trace))])
    assert digest == body_digest(JSON.canonical_value, body)
    assert encode_body(body, False)[4] is None  # type: ignore[index]


@pytest.mark.parametrize(
    "value", [{1: "key"}, {"set": {1}}, [float], 10**5000], ids=["key", "set", "type", "int"]
)
def test_a_refused_value_leaves_it_to_the_codec(value: Any) -> None:
    body = commit_body([("t", {"ok": 1})], None, (), (), {"bad": value}, str_ids=True)
    assert encode_body(body, True) is None


def test_only_the_json_codecs_own_methods_take_the_one_walk() -> None:
    class Keeps(JsonCodec):
        __slots__ = ()

    class Sorted(JsonCodec):
        __slots__ = ()

        def encode_value(self, value: Any) -> str:
            return self.canonical_value(value)

    assert is_plain_json(JSON) and is_plain_json(Keeps())
    assert not is_plain_json(Sorted()) and not is_plain_json(object())


def test_a_replay_is_recognised_across_both_paths(pg_server: Any, pg_schema: str) -> None:
    event = {"type": "shipped", "order": 7, "tags": ("a", "b")}
    step = {"event": "ship", "transition": "packing->shipped", "actions": ["notify"]}
    with PostgresStore(pg_server.url, schema=pg_schema) as store:
        assert store._core.plain_json
        for n, first in enumerate([False, True]):  # exe-0 written by the codec path
            exe = Execution(id=f"exe-{n}")
            for plain in (first, not first):
                store._core.plain_json = plain
                store.commit(exe, [("t", event)], "ev", trace=step, commit_id="c-1")
                assert exe.version == 1  # the second is the first's replay
                exe.version = 0
                with pytest.raises(IdempotencyConflict):
                    store.commit(exe, [("t", {**event, "order": 8})], "ev", commit_id="c-1")
                exe.version = 1
    with psycopg.connect(pg_server.url) as conn:
        events = conn.execute(f'SELECT event FROM "{pg_schema}".outbox').fetchall()
        digests = conn.execute(f'SELECT digest FROM "{pg_schema}".commit_ids').fetchall()
        steps = conn.execute(f'SELECT step FROM "{pg_schema}".trace').fetchall()
    assert len(events) == len(digests) == len(steps) == 2
    assert events[0] == events[1] and digests[0] == digests[1] and steps[0] == steps[1]
