"""The digest a durable store records for a commit body, in place of the body itself.

Below the checks and every store: a memory store compares a replay with a copied
:class:`Digest` by digesting the replay's body, and the durable stores record
:func:`body_digest` for each commit id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Digest", "body_digest", "same_encoding"]


class _Unequal:
    """Compares equal to nothing but itself: fills a :class:`Digest`'s five items, so a
    memory store's cheap field-by-field replay check always falls through to the full
    comparison, which the digest decides."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<digested>"


_UNEQUAL = _Unequal()
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


class Digest(tuple[Any, ...]):
    """A durable store's record of a commit body: a SHA-256 of it in a canonical encoding,
    with the function (``canonical``, a codec's ``canonical_value``) that encodes it.

    It stands where a memory store keeps a body (a 5-tuple), and compares equal to a
    5-tuple body whose digest it is, so a memory store that copied it recognises a replay
    of the commit; an unequal or unencodable body is a different one. Immutable:
    copying returns it.
    """

    sha256: bytes
    canonical: Callable[[Any], str | bytes]

    def __new__(cls, sha256: bytes, canonical: Callable[[Any], str | bytes]) -> Self:
        if type(sha256) is not bytes or len(sha256) != 32:
            raise TypeError(f"a Digest holds 32 bytes of SHA-256, got {type(sha256).__name__}")
        if not callable(canonical):
            raise TypeError(f"canonical must be a function, got {type(canonical).__name__}")
        self = tuple.__new__(cls, (_UNEQUAL,) * 5)
        self.sha256 = sha256
        self.canonical = canonical
        return self

    def same_encoding(self, canonical: Callable[[Any], str | bytes]) -> bool:
        """Whether ``canonical`` encodes as the function this digest was made with (see
        :func:`same_encoding`)."""
        return same_encoding(self.canonical, canonical)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Digest):
            return self.sha256 == other.sha256 and self.same_encoding(other.canonical)
        if type(other) is tuple and len(other) == 5:
            try:
                return body_digest(self.canonical, other) == self.sha256
            except _ENCODE_ERRORS:
                return False  # a body the encoding refuses is not the one it encoded
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"Digest({self.sha256.hex()[:16]}...)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Digest, (self.sha256, self.canonical))

    def __copy__(self) -> Digest:
        return self

    def __deepcopy__(self, memo: Any) -> Digest:
        return self


def same_encoding(a: Callable[[Any], Any], b: Callable[[Any], Any]) -> bool:
    """Whether two canonical encoders are the same function, or methods of two codecs
    that share the method's function (a ``JsonCodec`` subclass that inherits
    ``canonical_value``): a codec's canonical encoding is taken not to depend on the
    codec object's state."""
    if a is b:
        return True
    func = getattr(a, "__func__", None)
    return func is not None and func is getattr(b, "__func__", None)


def body_digest(canonical: Callable[[Any], str | bytes], body: Sequence[Any]) -> bytes:
    """The SHA-256 a durable store records for a commit body (the five fields of
    :class:`harel_store._checks.Body`), encoded by ``canonical``: the same value the
    SQLite and PostgreSQL stores' ``_digest`` compute."""
    emits, processed_event_id, timers, spawns, trace = body
    value = [
        [[target, event] for target, event in emits],
        processed_event_id,
        [[action, path, fire_at] for action, path, fire_at in timers],
        [[child, root, context] for child, root, context in spawns],
        trace,
    ]
    data = canonical(value)
    if type(data) is str:
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).digest()  # type: ignore[arg-type]
