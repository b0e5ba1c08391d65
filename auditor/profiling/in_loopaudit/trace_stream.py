"""The complete (`"ph": "X"`) events of a Chrome-trace JSON file, read as a stream within fixed bounds.

`loopaudit analyze` reads files it did not write. A trace of a long profiling window is gigabytes
once decompressed, and a file may hold anything at all, so it is never held in memory: it is
decompressed and parsed as it is read (ijson, whose C backend is yajl), and of each complete event
only the fields the analysis reads are passed on.

Skipped, since profilers write them and the analysis needs none of them: events of other phases
(flows, metadata, instant events), entries of the event list that are not objects, complete events
whose `ts` is missing or not a number (nor a string of one) or whose `dur` is present and not one,
and every key that is not read.

Refused with a TraceError that says what and where (`traceEvents[1234].ts`), because no profiler
writes them and a streaming parser cannot step over most of them, so refusing is the one rule that
holds for all of them:
- NaN, Infinity and -Infinity anywhere in the file (Python's `json` accepts them, JSON does not),
  integers beyond 64 bits and numbers beyond a double's range (a 5,001-digit timestamp);
- a `ts` or `dur` that converts to a number that is not finite (the string "NaN");
- nesting deeper than MAX_DEPTH levels, counted from the document (100,000 nested arrays);
- more than MAX_VALUE_BYTES of input in which no event (nor top-level entry) comes to its end: the
  parser would buffer a huge string or number whole, and read a gigabyte of whitespace to its end;
- an event list of more than MAX_ENTRIES entries, kept or skipped: a gigabyte of `0,` or of
  metadata events would otherwise take minutes;
- anything that is not JSON, not gzip, or not readable.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from math import isfinite
from pathlib import Path
from typing import Any, BinaryIO, cast

import ijson

# A kineto trace nests six levels deep (the document, traceEvents, an event, its args, a list of
# shapes, a shape); 64 leaves room for any real one and stops a pathological one at once.
MAX_DEPTH = 64
# The largest event in the real traces of the test data takes 5.5 KB, the largest top-level entry
# (distributedInfo and the like) 17 KB: 16 MiB is a thousand times more.
MAX_VALUE_BYTES = 16 << 20
# The ResNet50 trace of the test data has 75,718 entries for its 6 steps, 44,666 of them complete
# events; this allows some 40 times as many, and stops a file of skipped entries within seconds.
MAX_ENTRIES = 3_000_000
RECORD_FEWER_STEPS = "record fewer steps, e.g. torch.profiler.schedule(wait=1, warmup=1, active=3)"
_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_CHUNK_BYTES = 1 << 18  # what the parser asks for at a time: fewer calls into Python than ijson's 64 KiB
_OPENERS = frozenset(("start_map", "start_array"))
_CLOSERS = frozenset(("end_map", "end_array"))
_EVENT_FIELDS = frozenset(("ph", "name", "cat", "ts", "dur", "pid", "tid"))
_NO_ARGS: dict = {}  # shared, never written: most events keep no args


class TraceError(Exception):
    """The file cannot be read as a profiler trace; the message says why."""


class _Refusal(Exception):
    """Something no profiler writes, found while reading; the reader adds where it is."""


class TraceReader:
    """Iterating gives the complete events of one trace file, in file order, each as soon as it is
    read, as a plain tuple (a named one costs more than the rest of the reading per event):
    `(name, cat, ts, dur, pid, tid, args)`, scalars as the file has them (None for an object or
    array), `ts` and `dur` finite floats, `args` only the keys asked for, with scalar values.
    Afterwards `devices` holds the GPU names of its `deviceProperties`, `rank` its `distributedInfo`'s
    rank (None without one), and `has_event_list` says
    whether it had a `traceEvents` list (or was one, in the bare-array form)."""

    def __init__(self, path: Path, kept_args: frozenset[str]) -> None:
        self.path = path
        self.kept_args = kept_args
        self.devices: list[str] = []
        self.rank: int | None = None  # distributedInfo.rank: which rank of a job recorded the trace
        self.has_event_list = False
        # Where the reading is, for messages and for the source's bound: the top-level key, and
        # the entry of the event list.
        self._key: str | None = None
        self._index: int | None = None
        self._list = ""

    def __iter__(self) -> Iterator[tuple]:
        try:
            with _decompressed(self.path) as raw:
                source = _BoundedSource(raw, lambda: (self._key, self._index))
                # basic_parse, not parse or items: those build the path of every nested value, which
                # for 100,000 nested arrays is gigabytes before any bound here could stop them.
                # use_float: yajl reads numbers itself and refuses any beyond 64 bits or a double's
                # range; without it the C backend hands a 5,001-digit integer to int(), whose digit
                # limit it mishandles (SystemError, or a segfault under ijson.parse, in ijson 3.6).
                tokens = ijson.basic_parse(source, use_float=True, buf_size=_CHUNK_BYTES)
                try:
                    yield from self._document(tokens)
                    next(tokens, None)  # the end of the file: anything but whitespace after the document is an error
                except ijson.JSONError as error:
                    if source.consumed == 0:
                        raise TraceError(f"{self.path} is empty") from None
                    raise TraceError(self._refusal(self._location(), _json_problem(error))) from None
                except _Refusal as refusal:
                    raise TraceError(self._refusal(self._location(), str(refusal))) from None
                except UnicodeDecodeError:  # a string escape yajl passes but UTF-8 cannot hold: "\udcff"
                    raise TraceError(
                        self._refusal(self._location(), "holds a string that is not Unicode text")
                    ) from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as error:
            raise TraceError(f"{self.path} is not a valid gzip file: {error}") from None
        except OSError as error:
            raise TraceError(f"cannot read {self.path}: {error.strerror or error}") from None

    def _refusal(self, location: str | None, problem: str) -> str:
        """One line: the file, what is wrong, and where (a path into the JSON) as far as it is known."""
        return f"{self.path} is not a profiler trace: {f'`{location}`' if location is not None else 'it'} {problem}"

    def _location(self) -> str | None:
        if self._index is not None:
            return f"{self._list}[{self._index}]"
        return self._key

    def _field(self, index: int, key: str | None) -> str:
        return f"{self._list}[{index}]" + (f".{key}" if key is not None else "")

    # The loops below take the tokens with `for`, each resuming the one iterator where the last
    # left it, rather than with next(): on a 35 MB trace that is 0.6 s instead of 1.2 s.

    def _document(self, tokens: Iterator) -> Iterator[tuple]:
        kind, _ = next(tokens, (None, None))  # ijson raises on an empty file; no token is no document either
        if kind == "start_array":  # the bare-array form of the Chrome trace format
            self.has_event_list = True
            yield from self._events(tokens, 1)
        elif kind == "start_map":
            for kind, key in tokens:
                if kind == "end_map":
                    break
                self._key = key
                kind, _ = next(tokens)
                if key == "traceEvents" and kind == "start_array":
                    self.has_event_list, self._list = True, "traceEvents"
                    yield from self._events(tokens, 2)
                elif key == "deviceProperties" and kind == "start_array":
                    self._devices(tokens, 2)
                elif key == "distributedInfo" and kind == "start_map":
                    self._distributed(tokens, 2)
                else:
                    _skip(tokens, kind, 1)
                self._key = None

    def _events(self, tokens: Iterator, depth: int) -> Iterator[tuple]:
        """The entries of the event list (a container at `depth`), its `start_array` just read."""
        index = self._index = 0
        for kind, _ in tokens:
            if kind == "end_array":
                self._index = None
                return
            if kind == "start_map":
                event = self._event(tokens, index, depth + 1)
                if event is not None:
                    yield event
            else:
                _skip(tokens, kind, depth)
            index = self._index = index + 1
            if index > MAX_ENTRIES:
                problem = f"holds more than {MAX_ENTRIES:,} entries, more than `loopaudit analyze` reads: {RECORD_FEWER_STEPS}"
                raise TraceError(self._refusal(self._list or None, problem))

    def _event(self, tokens: Iterator, index: int, depth: int) -> tuple | None:
        """The event whose `start_map` was just read, if it is a complete one with a timestamp."""
        fields: dict[str, Any] = {}
        args = _NO_ARGS
        members = _Members(tokens)
        try:
            for key, kind, value in members:
                if kind in _OPENERS:
                    if key == "args" and kind == "start_map":
                        args = self._args(tokens, index, depth + 1)
                    else:
                        _skip(tokens, kind, depth)
                        if key in _EVENT_FIELDS:
                            fields[key] = None  # an object or array where a scalar belongs: no better than null
                elif key in _EVENT_FIELDS:
                    fields[key] = value
        except (ijson.JSONError, _Refusal, UnicodeDecodeError) as error:
            raise TraceError(self._refusal(self._field(index, members.key), _problem(error))) from None
        if fields.get("ph") != "X":
            return None
        try:
            ts, dur = float(fields["ts"]), float(fields.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return None
        if not (isfinite(ts) and isfinite(dur)):
            key = "ts" if not isfinite(ts) else "dur"
            raise TraceError(self._refusal(self._field(index, key), f"is {fields[key]!r}: not a finite number"))
        return fields.get("name", ""), fields.get("cat", ""), ts, dur, fields.get("pid"), fields.get("tid"), args

    def _args(self, tokens: Iterator, index: int, depth: int) -> dict:
        """The kept keys of the args object (a container at `depth`) whose `start_map` was just read."""
        kept = {}
        members = _Members(tokens)
        try:
            for key, kind, value in members:
                if kind in _OPENERS:
                    _skip(tokens, kind, depth)
                elif key in self.kept_args:
                    kept[key] = value
        except (ijson.JSONError, _Refusal, UnicodeDecodeError) as error:
            where = "args" if members.key is None else f"args.{members.key}"
            raise TraceError(self._refusal(self._field(index, where), _problem(error))) from None
        return kept

    def _devices(self, tokens: Iterator, depth: int) -> None:
        """The names in the deviceProperties list (a container at `depth`), its `start_array` just read."""
        for kind, _ in tokens:
            if kind == "end_array":
                return
            if kind != "start_map":
                _skip(tokens, kind, depth)
                continue
            name = key = None
            for kind, value in tokens:
                if kind == "map_key":
                    key = value
                elif kind == "end_map":
                    break
                elif kind in _OPENERS:
                    _skip(tokens, kind, depth + 1)
                elif key == "name":
                    name = value
            if name:
                self.devices.append(str(name))

    def _distributed(self, tokens: Iterator, depth: int) -> None:
        """The rank in the distributedInfo object (a container at `depth`), its `start_map` just read."""
        for key, kind, value in _Members(tokens):
            if kind in _OPENERS:
                _skip(tokens, kind, depth)
            elif key == "rank" and isinstance(value, (int, float)) and float(value).is_integer() and value >= 0:
                self.rank = int(value)


class _Members:
    """The members of the JSON object whose `start_map` was just read, as (key, kind, value), up to its
    `end_map`. A member whose value is an object or array comes with its opening kind: the caller reads
    it or skips it before asking for the next. `key` is the key whose value is being read (None between
    members), for messages about a value that cannot be read."""

    def __init__(self, tokens: Iterator) -> None:
        self.tokens = tokens
        self.key = None

    def __iter__(self) -> Iterator[tuple]:
        for kind, value in self.tokens:
            if kind == "map_key":
                self.key = value
                continue
            if kind == "end_map":
                return
            yield self.key, kind, value
            self.key = None


def _skip(tokens: Iterator, kind: str, depth: int) -> None:
    """Read past a value inside a container at `depth`, its first token (`kind`) already read."""
    if kind not in _OPENERS:
        return
    level = depth + 1
    if level > MAX_DEPTH:
        raise _Refusal(f"nests deeper than {MAX_DEPTH} levels")
    for kind, _ in tokens:
        if kind in _OPENERS:
            level += 1
            if level > MAX_DEPTH:
                raise _Refusal(f"nests deeper than {MAX_DEPTH} levels")
        elif kind in _CLOSERS:
            level -= 1
            if level == depth:
                return


def _problem(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "holds a string that is not Unicode text"
    return _json_problem(error) if isinstance(error, ijson.JSONError) else str(error)


def _json_problem(error: ijson.JSONError) -> str:
    """What the parser found, in words. yajl's message is its reason, then the text around the
    error, then a caret line pointing one past the byte it stopped at."""
    detail = error.args[0] if error.args else ""
    if isinstance(detail, bytes):  # yajl's message quotes the input's bytes, which may not be text
        detail = detail.decode("utf-8", "backslashreplace")
    reason, *context = str(detail).splitlines() or [""]
    if "integer overflow" in reason:
        return "is an integer beyond 64 bits"
    if "floating point) overflow" in reason:
        return "is a number beyond the range of a double"
    if len(context) >= 2 and "^" in context[1]:
        text = context[0][context[1].index("^") - 1 :]
        literal = next((word for word in ("NaN", "Infinity", "-Infinity") if text.startswith(word)), None)
        if literal is not None:
            return f"is {literal}: not a finite number (JSON has no NaN or Infinity)"
    return f"is not valid JSON ({reason.rstrip('.')})"


class _BoundedSource:
    """The file's (decompressed) bytes for the parser, which gets no more once MAX_VALUE_BYTES have
    gone by while the reader's `progress()` (where it is) stayed the same."""

    def __init__(self, raw: BinaryIO, progress: Callable[[], object]) -> None:
        self._raw = raw
        self._progress = progress
        self.consumed = 0
        self._mark: object = None
        self._mark_at: int | None = None

    def read(self, size: int) -> bytes:
        mark = self._progress()
        if mark != self._mark:
            self._mark, self._mark_at = mark, self.consumed
        elif self.consumed - cast(int, self._mark_at) > MAX_VALUE_BYTES:  # set by the first read
            raise _Refusal(
                f"runs past {MAX_VALUE_BYTES >> 20} MiB without ending: no profiler writes a value that large"
            )
        chunk = self._raw.read(size)
        self.consumed += len(chunk)
        return chunk


@contextmanager
def _decompressed(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes, decompressed as they are read when it is gzip (by its magic, not its name),
    from after a UTF-8 byte-order mark if there is one (an editor may add it; Python's json reads it)."""
    with open(path, "rb") as file:
        if file.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=file) as unpacked:
                yield _after_byte_order_mark(unpacked)
        else:
            yield _after_byte_order_mark(file)


def _after_byte_order_mark(stream: io.BufferedReader | gzip.GzipFile) -> BinaryIO:
    if stream.peek(3)[:3] == _UTF8_BOM:
        stream.read(3)
    return cast(BinaryIO, stream)
