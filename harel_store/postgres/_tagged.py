"""A commit body's values encoded for the default codec with one tagging walk each.

``JsonCodec.encode_value`` and ``canonical_value`` both tag a value (tuples and tag-like
dicts rewritten) and then write it, in its own key order or sorted. The commit writes
each event, spawn root, spawn context and trace step in its own order and digests the
whole body sorted (:func:`harel_store._digest.body_digest`): tagging each value once and
writing the digest's list of already tagged values gives the very text
``canonical_value`` gives for the body, and so the same digest, for half the walks.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .._checks import Body
from .._codec import JsonCodec, _encode, _encode_sorted, _Refused, _tag
from ._statements import _Blobs

_REFUSED = (_Refused, TypeError, ValueError, OverflowError, RecursionError)


def is_plain_json(codec: Any) -> bool:
    """Whether ``codec`` encodes values with :class:`JsonCodec`'s own ``encode_value``
    and ``canonical_value`` (the default codec, or a subclass that keeps both)."""
    return all(
        getattr(getattr(codec, name, None), "__func__", None) is getattr(JsonCodec, name)
        for name in ("encode_value", "canonical_value")
    )


def _text(tagged: Any) -> bytes:
    """A tagged value as a durable store holds it (``_statements._pack`` of its text)."""
    return b"t" + _encode(tagged).encode("utf-8", "surrogatepass")


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
        events = _Blobs([_text(event) for event in tagged_events])
        roots = _Blobs([_text(root) for root, _ in tagged_spawns])
        contexts = _Blobs([_text(context) for _, context in tagged_spawns])
        step = _Blobs() if tagged_step is None else _Blobs([_text(tagged_step)])
        digest = None
        if with_digest:
            # The list body_digest builds, its values already tagged: _tag of the whole
            # leaves these lists and their scalars (ids, floats, None) as they are.
            value = [
                [[target, event] for (target, _), event in zip(body.emits, tagged_events)],
                body.processed_event_id,
                [[action, path, fire_at] for action, path, fire_at in body.timers],
                [
                    [child, root, context]
                    for (child, _, _), (root, context) in zip(body.spawns, tagged_spawns)
                ],
                tagged_step,
            ]
            data = _encode_sorted(value).encode("utf-8", "surrogatepass")
            digest = hashlib.sha256(data).digest()
    except _REFUSED:
        return None
    return events, roots, contexts, step, digest
