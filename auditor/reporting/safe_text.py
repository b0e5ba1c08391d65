"""Any text, written so that the output it goes into stays valid: file names that are not UTF-8,
control characters from the scanned code or a trace, characters a terminal's encoding lacks.

A name that is not UTF-8 (legal on Linux) reaches us from os.fsdecode with each undecodable byte as
a lone surrogate, U+DC80 to U+DCFF, which no UTF-8 encoder writes. Every text format shows such a
byte the way Python writes it, `\\xff`: text that was valid stays exactly as it was, and the exact
bytes are kept where a format can carry them (SARIF's URIs, the fingerprints: see sarif.py and
fingerprint.py). The machine-readable formats are written in ASCII (JSON's `\\u` escapes, XML's
character references), so that no stream encoding can corrupt them.
"""

from __future__ import annotations

import math
import re
from typing import TextIO

_SURROGATE = re.compile("[\ud800-\udfff]")
# XML 1.0 cannot carry these at all, not even as character references (its `Char` production).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
# What a terminal would act on instead of showing: C0 controls but tab (the full format lays tabs
# out), DEL, and C1 controls (U+009B is CSI, an escape sequence's start, for some terminals).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# The reports' own symbols, spelled in ASCII for a stream that cannot carry them.
_ASCII_STAND_INS = {"—": "-", "→": "->", "×": "x", "█": "#", "░": ".", "▓": "="}


def _escape_surrogate(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate written as a Python escape: `\\xff` for a byte that
    os.fsdecode could not decode, `\\ud800` for any other. The result always encodes as UTF-8, and
    text that already did is returned unchanged."""
    return _SURROGATE.sub(_escape_surrogate, text)


def json_ready(value: object) -> object:
    """A JSON document (dicts, lists, strings, numbers) that `json.dump` writes as valid JSON: every
    string, keys included, through `escape_surrogates` (a lone `\\udcff` escape is JSON that strict
    parsers reject), and every NaN or infinity as null (JSON has no such numbers)."""
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {json_ready(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def _control_picture(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # U+241B SYMBOL FOR ESCAPE for ESC, and so on
    return "\u2421" if code == 0x7F else f"\\u{code:04x}"


def xml_ready(text: str) -> str:
    """`text` as XML 1.0 can carry it: surrogates escaped, each C0 control XML forbids shown as its
    Unicode control picture (ESC as U+241B), and U+FFFE / U+FFFF as U+FFFD."""
    return _NOT_XML.sub(
        lambda m: "\ufffd" if m.group() in "\ufffe\uffff" else _control_picture(m), escape_surrogates(text)
    )


def terminal_ready(text: str) -> str:
    """`text` from outside (a file name, a line of code, a trace's names) made safe to print: every
    control character shown as its control picture (as ruff shows them), so that a file name cannot
    move the cursor, change colours or break a one-line format; surrogates escaped. One character
    in, one out, except the escapes."""
    return _CONTROL.sub(_control_picture, escape_surrogates(text))


def encodable(text: str, encoding: str) -> str:
    """`text` as a stream in `encoding` can write it: surrogates escaped, then each character the
    encoding lacks as an ASCII stand-in (`→` as `->`) or a backslash escape (`\\xe9`)."""
    text = escape_surrogates(text)
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return "".join(_encodable_character(character, encoding) for character in text)


def _encodable_character(character: str, encoding: str) -> str:
    try:
        character.encode(encoding)
        return character
    except UnicodeEncodeError:
        return _ASCII_STAND_INS.get(character) or character.encode("ascii", "backslashreplace").decode("ascii")


class EncodableStream:
    """A text stream over `out` that writes only what `out`'s encoding can carry (see `encodable`):
    the text formats and rich's consoles write through one, so that an ASCII terminal or pipe
    (`PYTHONIOENCODING=ascii`, a Latin-1 locale) gets a report, not a UnicodeEncodeError."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.encoding = getattr(out, "encoding", None) or "utf-8"  # io.StringIO has none: it takes any str

    def write(self, text: str) -> int:
        return self._out.write(encodable(text, self.encoding))

    def flush(self) -> None:
        self._out.flush()
