"""A commit body's values encoded for the default codec with one tagging walk each.

``JsonCodec.encode_value`` and ``canonical_value`` both tag a value (tuples and tag-like
dicts rewritten) and then write it, in its own key order or sorted. The commit writes
each event, spawn root, spawn context and trace step in its own order and digests the
whole body sorted (:func:`harel_store._digest.body_digest`): tagging each value once and
writing the digest's list of already tagged values gives the very text
``canonical_value`` gives for the body, and so the same digest, for half the walks.
"""

from __future__ import annotations

from typing import Any

from .._checks import Body
from .._codec import JsonCodec, _encode, _encode_sorted, _Refused, _tag
from .._digest import body_digest
from ._statements import _Blobs, _pack

_REFUSED = (_Refused, TypeError, ValueError, OverflowError, RecursionError)


def is_plain_json(codec: Any) -> bool:
    """Whether ``codec`` encodes values with :class:`JsonCodec`'s own ``encode_value``
    and ``canonical_value`` (the default codec, or a subclass that keeps both)."""
    return all(
        getattr(getattr(codec, name, None), "__func__", None) is getattr(JsonCodec, name)
        for name in ("encode_value", "canonical_value")
    )


def encode_body(
    body: Body, with_digest: bool
) -> tuple[_Blobs, _Blobs, _Blobs, _Blobs, bytes | None] | None:
    """The packed events, spawn roots, spawn contexts and trace step of ``body`` as
    ``JsonCodec.encode_value`` writes them, and (``with_digest``) the body's
    :func:`~harel_store._digest.body_digest` under ``JsonCodec.canonical_value``; or
    ``None`` when a value is refused: the caller then encodes through the codec, which
    raises the error that names it."""
    try:
        tagged_events = [_tag(event) for _, event in body.emits]
        tagged_spawns = [(_tag(root), _tag(context)) for _, root, context in body.spawns]
        tagged_step = None if body.trace is None else _tag(body.trace)
        events = _Blobs([_pack(_encode(event)) for event in tagged_events])
        roots = _Blobs([_pack(_encode(root)) for root, _ in tagged_spawns])
        contexts = _Blobs([_pack(_encode(context)) for _, context in tagged_spawns])
        step = _Blobs() if tagged_step is None else _Blobs([_pack(_encode(tagged_step))])
        digest = None
        if with_digest:
            # The body with its values already tagged: _tag of the whole would leave the
            # lists body_digest builds, and their scalars, as they are.
            tagged_body = (
                [(target, event) for (target, _), event in zip(body.emits, tagged_events)],
                body.processed_event_id,
                body.timers,
                [
                    (child, root, ctx)
                    for (child, _, _), (root, ctx) in zip(body.spawns, tagged_spawns)
                ],
                tagged_step,
            )
            digest = body_digest(_encode_sorted, tagged_body)
    except _REFUSED:
        return None
    return events, roots, contexts, step, digest
