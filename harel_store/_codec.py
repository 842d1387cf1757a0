"""The codec of the durable stores: the one place that knows the types of what they hold.

A durable store keeps an execution as one encoded blob beside its ``version`` column, and
each event, spawn context, spawn root path and trace step as an encoded value, through
the methods of its codec (:class:`Codec`). The default, :data:`JSON`, is a
:class:`JsonCodec`; an engine with its own execution class passes ``codec=`` an object
with these methods, often a :class:`JsonCodec` subclass. Both are public as
``harel_store.sqlite.Codec`` and ``harel_store.sqlite.JsonCodec``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Protocol, runtime_checkable

from ._errors import reason, shown
from ._records import Execution

__all__ = ["JSON", "Codec", "JsonCodec"]

_TUPLE = "__tuple__"
_DICT = "__dict__"
_SCALARS = frozenset([str, int, float, bool, type(None)])
_FIELDS = (
    "id",
    "definition_id",
    "status",
    "outcome",
    "active_path",
    "history",
    "context",
    "parent_id",
    "child_id",
    "children",
)
_ACCEPTS = "None, bool, int, float, str, list, tuple and dict with str keys"
# How deep a value may nest, counted by the walks themselves: a build compiles this module,
# and a compiled call nests in C, where no recursion limit stops a value that contains
# itself before the stack ends. json's writer and reader stop near the interpreter's
# recursion limit (1000 by default) anyway, and a tagged tuple is two levels of JSON.
DEPTH_MAX = 400


@runtime_checkable
class Codec(Protocol):
    """What a durable store needs of ``codec=``: four methods, and an optional fifth,
    ``canonical_value(value) -> str | bytes``.

    ``canonical_value`` encodes the same value always the same way, dicts in any key
    order included: it is what a replayed ``commit_id`` is compared with (a SHA-256 of it
    is stored). Without it the store uses ``encode_value``, which must then be
    deterministic for equal values.

    Each method either returns or raises ``TypeError`` (or ``ValueError``) for what it
    cannot encode; the store re-raises it as a ``TypeError`` naming the item (the
    execution, the event of ``emits[i]``, ...) before it writes anything. ``str`` is
    stored as SQLite ``TEXT``, ``bytes`` as a ``BLOB``; decoding gets back what encoding
    returned.

    An engine with its own execution class passes ``codec=`` an object with these
    methods, often a :class:`JsonCodec` subclass that overrides the execution pair (and,
    for values JSON cannot hold, the value pair)::

        class OrderCodec(JsonCodec):
            def encode_execution(self, exe):
                return self.encode_value({"id": exe.id, "state": exe.state, "items": exe.items})

            def decode_execution(self, data):
                return Order(**self.decode_value(data))
    """

    def encode_execution(self, exe: Any) -> str | bytes:
        """The execution without its ``version`` (the store keeps that in its own
        column)."""

    def decode_execution(self, data: str | bytes) -> Any:
        """A new object, equal field by field to the one encoded; the store then sets
        its ``version``."""

    def encode_value(self, value: Any) -> str | bytes:
        """An event, a spawn context or root path, a trace step (a ``dict``)."""

    def decode_value(self, data: str | bytes) -> Any:
        """A new value equal to the one encoded. A trace step must come back as a
        ``dict``."""


class _Refused(Exception):
    """Raised inside the tagging walk; turned into a ``TypeError`` with a location."""


def _tag(value: Any, depth: int = 0) -> Any:
    """``value`` in the form ``json`` writes as intended: the very object when nothing in
    it needs a tag (the common case, no copy), else a copy with tuples tagged."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return _tag_dict(value, depth)
    if kind is list:
        return _tag_items(value, depth)
    if kind is tuple:
        return {_TUPLE: _tag_items(value, depth)}
    raise _Refused


def _tag_items(items: Any, depth: int) -> Any:
    if depth >= DEPTH_MAX:
        raise _Refused
    depth += 1
    for i, item in enumerate(items):
        if type(item) not in _SCALARS:
            tagged = _tag_inner(item, depth)
            if tagged is not item:
                out = list(items[:i])
                out.append(tagged)
                for item in items[i + 1 :]:
                    out.append(item if type(item) in _SCALARS else _tag_inner(item, depth))
                return out
    return items


def _tag_dict(value: dict[Any, Any], depth: int) -> Any:
    if depth >= DEPTH_MAX:
        raise _Refused
    depth += 1
    if len(value) == 1 and (_TUPLE in value or _DICT in value):
        return {_DICT: [[key, _tag(item, depth)] for key, item in value.items()]}
    out = None
    for key, item in value.items():
        if type(key) is not str:
            raise _Refused
        kind = type(item)
        if kind not in _SCALARS:  # _tag_inner, inlined: most values are dicts of scalars
            if kind is dict:
                tagged = _tag_dict(item, depth)
            elif kind is tuple:
                tagged = {_TUPLE: _tag_items(item, depth)}
            elif kind is list:
                tagged = _tag_items(item, depth)
            else:
                raise _Refused
            if tagged is not item:
                if out is None:
                    out = value.copy()
                out[key] = tagged
    return value if out is None else out


def _tag_inner(value: Any, depth: int) -> Any:
    """:func:`_tag` of a value known not to be a scalar."""
    kind = type(value)
    if kind is dict:
        return _tag_dict(value, depth)
    if kind is tuple:
        return {_TUPLE: _tag_items(value, depth)}
    if kind is list:
        return _tag_items(value, depth)
    raise _Refused


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        if _TUPLE in obj:
            return tuple(obj[_TUPLE])
        if _DICT in obj:
            return dict(obj[_DICT])
    return obj


def _locate(value: Any, where: str = "", depth: int = 0) -> str:
    """Where in ``value`` the first thing JSON cannot hold is, and what it is (``""``:
    nothing, or deeper than :data:`DEPTH_MAX`)."""
    kind = type(value)
    if kind in _SCALARS or depth >= DEPTH_MAX:
        return ""
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"a dict key {shown(key)} ({type(key).__name__}) at {where or 'the top'}"
            found = _locate(item, f"{where}[{key!r}]", depth + 1)
            if found:
                return found
        return ""
    if kind is list or kind is tuple:
        for i, item in enumerate(value):
            found = _locate(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
        return ""
    return f"a {kind.__qualname__} at {where or 'the top'}"


def _refusal(value: Any) -> TypeError:
    try:
        found = _locate(value)
    except RecursionError:
        found = ""
    if not found:  # (a value deeper than DEPTH_MAX has nothing refused above that depth)
        return TypeError("nested too deeply for JSON, or it contains itself")
    return TypeError(f"{found} is not a JSON value ({_ACCEPTS}); pass codec= for other types")


def _make_writer(sort_keys: bool) -> Callable[[Any, int], Any]:
    """A compact JSON writer, made once (``json.dumps`` builds its C encoder on every
    call): ``"".join(write(value, 0))`` is the text."""
    if c_make_encoder is None:  # an interpreter without the C accelerator
        encode = json.JSONEncoder(
            separators=(",", ":"), check_circular=False, sort_keys=sort_keys
        ).encode
        return lambda value, _: (encode(value),)
    return c_make_encoder(  # type: ignore[no-any-return]
        None, None, encode_basestring_ascii, None, ":", ",", sort_keys, False, True
    )


_write = _make_writer(False)
_write_sorted = _make_writer(True)
_join = "".join


def _encode(value: Any) -> str:
    return _join(_write(value, 0))


def _encode_sorted(value: Any) -> str:
    return _join(_write_sorted(value, 0))


_decode = json.JSONDecoder(object_hook=_untag).decode


class JsonCodec:
    """The default codec: JSON text, tuples tagged.

    It round-trips :class:`~harel_store.Execution` exactly and any value built of
    ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple`` and ``dict`` with
    ``str`` keys, nested as deep as Python's recursion limit allows: tuples come back as
    tuples, floats as floats (``nan`` and the infinities included), strings exactly (NUL,
    lone surrogates and astral characters included: the text is pure ASCII, every other
    character escaped). Only these exact types are accepted: a subclass (an ``IntEnum``,
    a ``NamedTuple``, an ``OrderedDict``) would come back as its base type, so it is
    refused, as are a dict key that is not a ``str`` and a cycle.

    The JSON is plain, with one tag: a tuple is ``{"__tuple__": [items]}``. A dict whose
    only key is ``"__tuple__"`` or ``"__dict__"`` is written ``{"__dict__": [[key,
    value]]}``, so no dict is ever mistaken for a tag. An execution is a JSON object of
    its fields but ``version``.

    Subclass it to encode an engine's own execution class (override
    :meth:`encode_execution`/:meth:`decode_execution`) or richer values (override the
    value methods); a subclass may call the ``encode_value``/``decode_value`` of this
    class for the JSON part (see :class:`Codec`).
    """

    __slots__ = ()

    def encode_execution(self, exe: Any) -> str:
        """An :class:`~harel_store.Execution` as a JSON object of its fields but
        ``version``."""
        if type(exe) is not Execution:
            raise TypeError(
                f"the default codec encodes harel_store.Execution, not {type(exe).__qualname__}: "
                "pass codec= for an execution class of your own"
            )
        fields = _fields(exe)
        try:
            # Tagged in place: the dict is ours, its keys known (what _tag_dict would copy).
            for name, item in fields.items():
                kind = type(item)
                if kind is dict:
                    if item:
                        fields[name] = _tag_dict(item, 1)
                elif kind not in _SCALARS:
                    fields[name] = _tag_inner(item, 1)
            return _join(_write(fields, 0))
        except (_Refused, RecursionError):
            raise _refusal(_fields(exe)) from None
        except ValueError as exc:  # an int too long to write
            raise TypeError(str(exc)) from None

    def decode_execution(self, data: str | bytes) -> Execution:
        """A new :class:`~harel_store.Execution` from what :meth:`encode_execution`
        returned, at version ``0`` (the store then sets its ``version``)."""
        fields = _decode(data if isinstance(data, str) else bytes(data).decode())
        return Execution(**{name: fields[name] for name in _FIELDS if name in fields})

    def encode_value(self, value: Any) -> str:
        """``value`` as JSON text, in its own key order."""
        try:
            # _tag, with the call saved for the common kinds (each value of every commit).
            kind = type(value)
            if kind is dict:
                value = _tag_dict(value, 0)
            elif kind is str:  # what the writer does with a str, without its set-up
                text: str = encode_basestring_ascii(value)
                return text
            elif kind not in _SCALARS:
                value = _tag_inner(value, 0)
            return _join(_write(value, 0))
        except (_Refused, RecursionError):
            raise _refusal(value) from None
        except ValueError as exc:
            raise TypeError(str(exc)) from None

    def decode_value(self, data: str | bytes) -> Any:
        """A new value equal to the one :meth:`encode_value` or :meth:`canonical_value`
        encoded."""
        return _decode(data if isinstance(data, str) else bytes(data).decode())

    def canonical_value(self, value: Any) -> str:
        """``value`` as JSON text with every dict's keys sorted: equal values, equal text."""
        try:
            kind = type(value)
            if kind is dict:
                value = _tag_dict(value, 0)
            elif kind not in _SCALARS:
                value = _tag_inner(value, 0)
            return _join(_write_sorted(value, 0))
        except (_Refused, RecursionError):
            raise _refusal(value) from None
        except ValueError as exc:
            raise TypeError(str(exc)) from None


JSON = JsonCodec()
"""The codec a durable store uses when it is given none."""


def _fields(exe: Execution) -> dict[str, Any]:
    return {
        "id": exe.id,
        "definition_id": exe.definition_id,
        "status": exe.status,
        "outcome": exe.outcome,
        "active_path": exe.active_path,
        "history": exe.history,
        "context": exe.context,
        "parent_id": exe.parent_id,
        "child_id": exe.child_id,
        "children": exe.children,
    }


def plain_values(codec: Any) -> bool:
    """Whether ``codec`` encodes values with :class:`JsonCodec`'s own ``encode_value``
    (the default codec, or a subclass that keeps it), which returns a ``str`` or raises."""
    method = getattr(codec, "encode_value", None)
    return getattr(method, "__func__", None) is JsonCodec.encode_value


def encode_execution(codec: Any, exe: Any, eid: str) -> str | bytes:
    """``codec.encode_execution(exe)``, its failures and odd results a ``TypeError``
    that names the execution: what a durable store raises before it writes."""
    try:
        data = codec.encode_execution(exe)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise TypeError(f"cannot encode the execution {eid!r}: {reason(exc)}") from exc
    if type(data) is not str and type(data) is not bytes:
        raise TypeError(
            f"the codec encoded the execution {eid!r} as a {type(data).__name__}, "
            "not a str or bytes"
        )
    return data


def encode_value(codec: Any, value: Any, what: str, i: int = -1) -> str | bytes:
    """``codec.encode_value(value)``, its failures a ``TypeError`` naming ``what``
    (``what[i]`` for an item of a list)."""
    try:
        data = codec.encode_value(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        where = what if i < 0 else f"{what}[{i}]"
        raise TypeError(f"cannot encode {where}: {reason(exc)}") from exc
    if type(data) is not str and type(data) is not bytes:
        where = what if i < 0 else f"{what}[{i}]"
        raise TypeError(f"the codec encoded {where} as a {type(data).__name__}, not a str or bytes")
    return data
