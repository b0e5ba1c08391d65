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
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable

# How deep a bare `dict` may nest: a finding's measurements are two levels deep.
_MAX_FREE_DEPTH = 16


class InvalidData(ValueError):
    """The data does not have the shape its type declares."""


def to_plain(value, kind) -> object:
    """`value`, declared as `kind`, as JSON-ready lists, dicts and scalars."""
    return _codec(kind)[0](value)


def from_plain(kind, data: object):
    """The value of type `kind` that `data` (as json.loads gave it) stands for; InvalidData if none."""
    return _codec(kind)[1](data)


_Codec = tuple[Callable[[object], object], Callable[[object], object]]
_CODECS: dict[object, _Codec] = {}


def _codec(kind) -> _Codec:
    codec = _CODECS.get(kind)
    if codec is None:
        codec = _CODECS[kind] = _make_codec(kind)
    return codec


def _make_codec(kind) -> _Codec:
    if kind is type(None) or kind is None:
        return _same, _exactly(type(None))
    if kind in (str, bool):
        return _same, _exactly(kind)
    if kind is int:
        return _same, _integer
    if kind is float:
        return _same, _number
    if kind is object:
        return _same, _scalar
    if kind is dict:
        return _same, lambda data: _free(data, 0)
    if dataclasses.is_dataclass(kind):
        return _record_codec(kind, [field.name for field in dataclasses.fields(kind)], keywords=True)
    if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):  # a NamedTuple
        return _record_codec(kind, list(kind._fields), keywords=False)
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        return _union_codec(arguments)
    if origin is tuple and not (len(arguments) == 2 and arguments[1] is Ellipsis):
        return _fixed_tuple_codec(arguments)
    if origin in (tuple, list, frozenset, set):
        return _sequence_codec(origin, arguments[0])
    if origin is dict:
        return _dict_codec(*arguments)
    raise TypeError(f"plain_data cannot carry values of type {kind!r}")


def _same(value):
    return value


def _exactly(kind: type):
    def check(data):
        if type(data) is not kind:
            raise InvalidData(f"expected {kind.__name__}, found {type(data).__name__}")
        return data

    return check


def _integer(data):
    if type(data) is not int:
        raise InvalidData(f"expected int, found {type(data).__name__}")
    return data


def _number(data):
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


def _record_codec(kind: type, names: list[str], *, keywords: bool) -> _Codec:
    hints = typing.get_type_hints(kind)
    fields = [(name, _codec(hints[name])) for name in names]

    def encode(value):
        return [field_encode(getattr(value, name)) for name, (field_encode, _) in fields]

    def decode(data):
        items = _array(data, len(fields))
        values = [field_decode(item) for (_, (_, field_decode)), item in zip(fields, items)]
        return kind(**dict(zip(names, values))) if keywords else kind(*values)

    return encode, decode


def _union_codec(alternatives: tuple) -> _Codec:
    optional = type(None) in alternatives
    others = [_codec(kind) for kind in alternatives if kind is not type(None)]
    if len(others) != 1:
        raise TypeError(f"plain_data carries only unions of one type and None, not {alternatives!r}")
    inner_encode, inner_decode = others[0]

    def encode(value):
        return None if value is None else inner_encode(value)

    def decode(data):
        return None if data is None and optional else inner_decode(data)

    return encode, decode


def _fixed_tuple_codec(kinds: tuple) -> _Codec:
    codecs = [_codec(kind) for kind in kinds]

    def encode(value):
        return [item_encode(item) for (item_encode, _), item in zip(codecs, value)]

    def decode(data):
        return tuple(item_decode(item) for (_, item_decode), item in zip(codecs, _array(data, len(codecs))))

    return encode, decode


def _sequence_codec(container: type, item_kind) -> _Codec:
    item_encode, item_decode = _codec(item_kind)
    plain_items = item_encode is _same

    def encode(value):
        return list(value) if plain_items else [item_encode(item) for item in value]

    def decode(data):
        try:
            return container(item_decode(item) for item in _array(data))
        except TypeError:  # an unhashable item (a list) for a frozenset
            raise InvalidData("an item cannot be a member of a set") from None

    return encode, decode


def _dict_codec(key_kind, value_kind) -> _Codec:
    key_encode, key_decode = _codec(key_kind)
    value_encode, value_decode = _codec(value_kind)
    if key_kind is str:  # a JSON object

        def decode_object(data):
            if type(data) is not dict:
                raise InvalidData(f"expected an object, found {type(data).__name__}")
            return {key: value_decode(value) for key, value in data.items()}

        return (lambda value: {key: value_encode(item) for key, item in value.items()}), decode_object

    def encode(value):
        return [[key_encode(key), value_encode(item)] for key, item in value.items()]

    def decode(data):
        pairs = [_array(pair, 2) for pair in _array(data)]
        try:
            return {key_decode(key): value_decode(item) for key, item in pairs}
        except TypeError:
            raise InvalidData("a key cannot be a dict key") from None

    return encode, decode
