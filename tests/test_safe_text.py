"""The helpers that make any text writable in each output (reporting/safe_text.py), the SARIF URI
of any file name and the fingerprint of any name, checked over every code point and every byte."""

from __future__ import annotations

import json
import math
import os
import re
import urllib.parse
from xml.etree import ElementTree

import jsonschema

from loopaudit.findings.finding import Finding, Location
from loopaudit.findings.fingerprint import fingerprints
from loopaudit.reporting.safe_text import encodable, escape_surrogates, json_ready, terminal_ready, xml_ready
from loopaudit.reporting.sarif import artifact_uri

EVERY_CODE_POINT = "".join(map(chr, range(0x110000)))
SURROGATES = re.compile("[\ud800-\udfff]")
VALID = SURROGATES.sub("", EVERY_CODE_POINT)


def test_escape_surrogates_writes_undecodable_bytes_as_python_does_and_leaves_valid_text_alone():
    assert escape_surrogates(EVERY_CODE_POINT).encode("utf-8")
    assert escape_surrogates(VALID) == VALID
    name = os.fsdecode(b"bad\xff\xfename.py")
    assert (
        escape_surrogates(name) == b"bad\xff\xfename.py".decode("utf-8", "backslashreplace") == "bad\\xff\\xfename.py"
    )
    assert escape_surrogates("trace \ud800") == "trace \\ud800"  # a lone surrogate no file system made


def test_json_ready_documents_are_json_that_any_parser_takes():
    document = {
        "file\udcff": ["bad\udcffname.py", {"nan": math.nan, "inf": -math.inf, "n": 1.5, "ok": True, "none": None}],
        "t": (1, "é"),
    }
    text = json.dumps(json_ready(document), allow_nan=False)  # allow_nan=False: NaN is no JSON
    assert text.isascii()
    assert json.loads(text) == {
        "file\\xff": ["bad\\xffname.py", {"nan": None, "inf": None, "n": 1.5, "ok": True, "none": None}],
        "t": [1, "é"],
    }
    assert json_ready(VALID) == VALID


def test_xml_ready_text_parses_as_attribute_and_element_and_keeps_what_xml_can_carry():
    shown = xml_ready(EVERY_CODE_POINT)
    element = ElementTree.Element("failure", message=shown)
    element.text = shown
    parsed = ElementTree.fromstring(ElementTree.tostring(element, encoding="us-ascii"))
    assert parsed.get("message") == shown
    xml_chars = re.sub("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "", VALID)
    assert xml_ready(xml_chars) == xml_chars
    assert xml_ready("\x1b\x0b\x01\x7f\ufffe") == "\u241b\u240b\u2401\x7f\ufffd"


def test_terminal_ready_text_holds_no_control_character_and_keeps_its_columns():
    shown = terminal_ready(VALID)
    assert re.findall("[\x00-\x08\x0a-\x1f\x7f-\x9f]", shown) == []
    assert len(shown) == len(VALID) + 32 * 5  # one for one, but the C1 controls, written `\u0080`
    assert terminal_ready("a\tb\x1b[2J\n\x7f") == "a\tb\u241b[2J\u240a\u2421"


def test_encodable_text_fits_the_stream_and_spells_the_reports_symbols_in_ascii():
    assert encodable(EVERY_CODE_POINT, "ascii").isascii()
    assert encodable(EVERY_CODE_POINT, "latin-1").encode("latin-1")
    assert encodable(VALID, "utf-8") == VALID
    assert (
        encodable("loop (a.py:3) → `step()` ×2 — █░▓ é \udcff", "ascii")
        == "loop (a.py:3) -> `step()` x2 - #.= \\xe9 \\xff"
    )


def test_artifact_uris_are_uri_references_of_the_exact_bytes():
    checker = jsonschema.FormatChecker()
    assert "uri-reference" in checker.checkers
    every_byte = bytes(byte for byte in range(1, 256) if byte != ord("/"))
    for raw in (every_byte, b"dir/" + every_byte, b"co:m.py", b"rate%25.py", b"../up.py", b"/abs/a b.py"):
        uri = artifact_uri(os.fsdecode(raw))
        assert checker.conforms(uri, "uri-reference"), uri
        assert urllib.parse.unquote_to_bytes(uri) == raw
        assert urllib.parse.urlsplit(uri).scheme == ""
    assert artifact_uri("trace \ud800.py") == "trace%20%ED%A0%80.py"  # from a trace's JSON: no bytes on disk


def test_fingerprints_tell_names_apart_by_their_bytes():
    def fingerprint(name: str) -> str:
        return fingerprints([Finding("LA101", "m", name, Location(1, 1), Location(1, 2), source_line="x.item()")])[0]

    names = [os.fsdecode(b"a\xff.py"), os.fsdecode(b"a\xfe.py"), "a\\xff.py", "a\ud800.py"]
    assert len({fingerprint(name) for name in names}) == len(names)
    assert fingerprint(os.fsdecode(b"a\xff.py")) == fingerprint(os.fsdecode(b"a\xff.py"))
