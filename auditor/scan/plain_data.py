"""Values as plain JSON data and back, checked against their declared types on the way back.

The cache keeps analyses between runs in files under the scanned project, which anyone who can send a
pull request can write. Reading them back must never run code (as `pickle.load` does) nor hand the
engine an object of the wrong shape: what comes back is built only from the type the caller asks for,
field by field, and anything that does not fit raises `InvalidData`.

The types are the engine's own annotations: dataclasses, NamedTuples, `tuple[...]`, `list[...]`,
`frozenset[...]`, `dict[K, V]`, `X | None`, str, int, float, bool and None. `object` stands for a
scalar (an argument's value: an int or a bool) and a bare `dict` for a JSON object of scalars, lists
and objects (a finding's measurements). A dataclass or a tuple is written as a JSON array in field
order; a dict with other than str keys as an array of [key, value] pairs.

A set that one value holds in many places is written once, as pickle would (every module's project
facts hold the project's root names, thousands of them, by one object): a later occurrence of the
same object is written `{"same_as": n}`, the n-th shared set written before it, and reads back as
that very object. The entries of a large project would otherwise hold those names a thousand times.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable

# How deep a bare `dict` may nest: a finding's measurements are two levels deep.
_MAX_FREE_DEPTH = 16
# Sets of at least this many items are written once per value (see above); smaller ones cost less
# written out than referred to.
_SHARED_FROM = 8


class InvalidData(ValueError):
    """The data does not have the shape its type declares."""


def to_plain(value, kind) -> object:
    """`value`, declared as `kind`, as JSON-ready lists, dicts and scalars."""
    return _codec(kind)[0](value, {})


def from_plain(kind, data: object):
    """The value of type `kind` that `data` (as json.loads gave it) stands for; InvalidData if none."""
    return _codec(kind)[1](data, [])


# encode(value, shared: id of each shared set written -> its number) and decode(data, shared: the
# shared sets read so far, in the order they were written).
_Codec = tuple[Callable[[object, dict], object], Callable[[object, list], object]]
_CODECS: dict[object, _Codec] = {}


def _codec(kind) -> _Codec:
    codec = _CODECS.get(kind)
    if codec is None:
        codec = _CODECS[kind] = _make_codec(kind)
    return codec


def _make_codec(kind) -> _Codec:
    if kind is type(None) or kind is None:
        return _same, _exactly(type(None))
    if kind in (str, bool, int):
        return _same, _exactly(kind)
    if kind is float:
        return _same, _number
    if kind is object:
        return _same, lambda data, shared: _scalar(data)
    if kind is dict:
        return _same, lambda data, shared: _free(data, 0)
    if dataclasses.is_dataclass(kind):
        return _record_codec(typing.cast(type, kind), [field.name for field in dataclasses.fields(kind)], keywords=True)
    if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):  # a NamedTuple
        return _record_codec(kind, list(kind._fields), keywords=False)
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        return _union_codec(arguments)
    if origin is tuple and not (len(arguments) == 2 and arguments[1] is Ellipsis):
        return _fixed_tuple_codec(arguments)
    if origin in (frozenset, set):
        return _set_codec(origin, arguments[0])
    if origin in (tuple, list):
        return _sequence_codec(origin, arguments[0])
    if origin is dict:
        return _dict_codec(*arguments)
    raise TypeError(f"plain_data cannot carry values of type {kind!r}")


def _same(value, shared):
    return value


class _exactly:
    """The decoder of a scalar type that JSON keeps apart (an int is no bool, a bool no int)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def __call__(self, data, shared=None):
        if type(data) is not self.kind:
            raise InvalidData(f"expected {self.kind.__name__}, found {type(data).__name__}")
        return data


def _number(data, shared):
    if type(data) is int:
        return float(data)
    if type(data) is not float or not math.isfinite(data):
        raise InvalidData(f"expected a finite float, found {data!r:.40}")
    return data


def _scalar(data):
    if data is None or type(data) in (bool, int, str) or (type(data) is float and math.isfinite(data)):
        return data
    raise InvalidData(f"expected a scalar, found {type(data).__name__}")


def _free(data, depth: int):
    """A JSON value of bounded depth: what a bare `dict` may hold."""
    if depth > _MAX_FREE_DEPTH:
        raise InvalidData("nested too deeply")
    if type(data) is dict:
        return {_exactly(str)(key): _free(value, depth + 1) for key, value in data.items()}
    if depth == 0:
        raise InvalidData(f"expected an object, found {type(data).__name__}")
    if type(data) is list:
        return [_free(item, depth + 1) for item in data]
    return _scalar(data)


def _array(data, length: int | None = None) -> list:
    if type(data) is not list:
        raise InvalidData(f"expected an array, found {type(data).__name__}")
    if length is not None and len(data) != length:
        raise InvalidData(f"expected {length} items, found {len(data)}")
    return data


def _items_decoder(item_decode):
    """data, shared -> the decoded items of an array. Items of one scalar type are checked in one pass."""
    if isinstance(item_decode, _exactly):
        kind = item_decode.kind

        def scalars(data, shared):
            items = _array(data)
            for item in items:
                if type(item) is not kind:
                    raise InvalidData(f"expected {kind.__name__}, found {type(item).__name__}")
            return items

        return scalars
    return lambda data, shared: [item_decode(item, shared) for item in _array(data)]


def _record_codec(kind: type, names: list[str], *, keywords: bool) -> _Codec:
    hints = typing.get_type_hints(kind)
    fields = [(name, _codec(hints[name])) for name in names]

    def encode(value, shared):
        return [field_encode(getattr(value, name), shared) for name, (field_encode, _) in fields]

    def decode(data, shared):
        items = _array(data, len(fields))
        values = [field_decode(item, shared) for (_, (_, field_decode)), item in zip(fields, items)]
        return kind(**dict(zip(names, values))) if keywords else kind(*values)

    return encode, decode


def _union_codec(alternatives: tuple) -> _Codec:
    optional = type(None) in alternatives
    others = [_codec(kind) for kind in alternatives if kind is not type(None)]
    if len(others) != 1:
        raise TypeError(f"plain_data carries only unions of one type and None, not {alternatives!r}")
    inner_encode, inner_decode = others[0]

    def encode(value, shared):
        return None if value is None else inner_encode(value, shared)

    def decode(data, shared):
        return None if data is None and optional else inner_decode(data, shared)

    return encode, decode


def _fixed_tuple_codec(kinds: tuple) -> _Codec:
    codecs = [_codec(kind) for kind in kinds]

    def encode(value, shared):
        return [item_encode(item, shared) for (item_encode, _), item in zip(codecs, value)]

    def decode(data, shared):
        return tuple(item_decode(item, shared) for (_, item_decode), item in zip(codecs, _array(data, len(codecs))))

    return encode, decode


def _sequence_codec(container: type, item_kind) -> _Codec:
    item_encode, item_decode = _codec(item_kind)
    items = _items_decoder(item_decode)

    def encode(value, shared):
        return list(value) if item_encode is _same else [item_encode(item, shared) for item in value]

    return encode, lambda data, shared: container(items(data, shared))


def _set_codec(container: type, item_kind) -> _Codec:
    """As a sequence, but a large set met again is written as a reference to its first writing."""
    item_encode, item_decode = _codec(item_kind)
    items = _items_decoder(item_decode)

    def encode(value, shared):
        if len(value) >= _SHARED_FROM:
            number = shared.get(id(value))
            if number is not None:
                return {"same_as": number}
            shared[id(value)] = len(shared)  # the value is alive as long as what holds it: ids stay unique
        return list(value) if item_encode is _same else [item_encode(item, shared) for item in value]

    def decode(data, shared):
        if type(data) is dict:
            number = data.get("same_as")
            if len(data) != 1 or type(number) is not int or not 0 <= number < len(shared):
                raise InvalidData("a reference to no set written before it")
            return shared[number]
        try:
            value = container(items(data, shared))
        except TypeError:  # an unhashable item (a list)
            raise InvalidData("an item cannot be a member of a set") from None
        if len(data) >= _SHARED_FROM:  # as the writer counted: the items as written
            shared.append(value)
        return value

    return encode, decode


def _dict_codec(key_kind, value_kind) -> _Codec:
    key_encode, key_decode = _codec(key_kind)
    value_encode, value_decode = _codec(value_kind)
    if key_kind is str:  # a JSON object

        def encode_object(value, shared):
            return {key: value_encode(item, shared) for key, item in value.items()}

        def decode_object(data, shared):
            if type(data) is not dict:
                raise InvalidData(f"expected an object, found {type(data).__name__}")
            return {key: value_decode(item, shared) for key, item in data.items()}

        return encode_object, decode_object

    def encode(value, shared):
        return [[key_encode(key, shared), value_encode(item, shared)] for key, item in value.items()]

    def decode(data, shared):
        pairs = [_array(pair, 2) for pair in _array(data)]
        try:
            return {key_decode(key, shared): value_decode(item, shared) for key, item in pairs}
        except TypeError:
            raise InvalidData("a key cannot be a dict key") from None

    return encode, decode
