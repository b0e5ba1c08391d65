"""A text for a value that is equal exactly when the values are, in every process.

Cache keys are made of analysis inputs and summaries, which hold sets and dicts. `repr` and `pickle`
write a set in its hash order, which differs from process to process (string hashing is salted per
run), so equal values would give different keys. Here sets and dicts are written sorted.
"""

from __future__ import annotations

import dataclasses
import hashlib


def canonical(value, memo: dict[int, tuple[object, str]] | None = None) -> str:
    """`memo` holds the texts of sets already written (every module's facts share one large set
    of the project's root names)."""
    if memo is None:
        memo = {}
    if value is None:
        return "None"
    kind = type(value)
    if kind is frozenset or kind is set:
        known = memo.get(id(value))
        if known is None or known[0] is not value:
            known = memo[id(value)] = (value, "{" + ",".join(sorted(canonical(item, memo) for item in value)) + "}")
        return known[1]
    if kind is tuple or kind is list:
        return "(" + ",".join(canonical(item, memo) for item in value) + ")"
    if kind is dict:
        return "{" + ",".join(sorted(f"{canonical(k, memo)}:{canonical(v, memo)}" for k, v in value.items())) + "}"
    if kind is str or kind is int or kind is bool:
        return repr(value)
    if dataclasses.is_dataclass(value):
        fields = [f.name for f in dataclasses.fields(value)]
        return "(" + ",".join(f"{name}={canonical(getattr(value, name), memo)}" for name in fields) + ")"
    return repr(value)


def digest(value) -> str:
    return hashlib.blake2b(canonical(value).encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


def content_digest(data: bytes) -> str:
    """The digest of a file's bytes, as the cache keys on them."""
    return hashlib.blake2b(data, digest_size=20).hexdigest()
