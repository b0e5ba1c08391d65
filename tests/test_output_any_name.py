"""Every output format, for any file name and any text in the code, through the installed command:
the machine-readable ones parse (SARIF validates with its URI formats checked), the terminal ones
never crash, not even on an ASCII stream, and nothing from the scanned files reaches a terminal as a
control character.

The names are legal on Linux: bytes that are not UTF-8, spaces, `%`, `<`, `:` and `,`, quotes,
rich's markup, newlines, a terminal escape sequence. A file system that refuses one (macOS refuses
bytes that are not UTF-8) leaves it out.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import urllib.parse
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest

from .conftest import run_cli
from .test_output_formats import sarif_validator

NAMES = [
    b"bad\xffname.py",  # not UTF-8: reaches Python as "bad\udcffname.py" (os.fsdecode)
    b"bad\\xffname.py",  # shown as the one above, but its own file: its URI and fingerprint differ
    b"space name.py",
    b"rate%25.py",  # a SARIF consumer decodes the URI: it must read `rate%25.py`, not `rate%.py`
    b"lt<gt>&amp;.py",
    "café 日本.py".encode(),
    b"co:m,ma.py",  # a URI would read `co:` as its scheme; GitHub separates properties with `,` and `:`
    b"quote'\"back\\slash#frag?q.py",
    b"[bold]markup[red].py",  # rich's markup
    b"esc\x1b[31mname.py",  # a terminal escape sequence
    b"new\nline.py",
    b"cr\rname.py",
    b"tab\tname.py",
]
# A valid Python string literal holding ESC, VT, DEL, SOH, the noncharacter U+FFFE and the C1
# control CSI, quoted by the finding's message and shown in its source line.
SCRIPT = textwrap.dedent("""\
    import torch
    model = torch.nn.Linear(4, 2).cuda()
    for x, y in loader:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        print(loss.mean(dim="\x1b[2J\x0b\x7f\x01\ufffe\x9b").item())
""")
# The command's standard output: UTF-8 with Python's default strict errors, ASCII, and the C locale.
ENVIRONMENTS = {
    "utf-8": {"PYTHONIOENCODING": "utf-8"},
    "ascii": {"PYTHONIOENCODING": "ascii"},
    "C-locale": {"PYTHONIOENCODING": "", "LANG": "C", "LC_ALL": "C"},
}
UTF8 = ENVIRONMENTS["utf-8"]


def shown(raw: bytes) -> str:
    """How a name is written in every text format: itself when UTF-8, else each byte as `\\xff`."""
    return raw.decode("utf-8", "backslashreplace")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> tuple[Path, list[bytes]]:
    folder = tmp_path_factory.mktemp("any-name")
    names = []
    for raw in NAMES:
        try:
            with open(os.fsencode(folder) + b"/" + raw, "wb") as file:
                file.write(SCRIPT.encode("utf-8"))
        except OSError:
            continue
        names.append(raw)
    assert len(names) >= len(NAMES) - 1  # all but the name that is not UTF-8, on macOS
    return folder, names


def write_first_accepted(folder: Path, names: list[bytes], content: str) -> bytes:
    """Writes `content` under the first of `names` the file system accepts, and returns that name."""
    for raw in names:
        try:
            (folder / os.fsdecode(raw)).write_text(content)
        except OSError:
            continue
        return raw
    raise AssertionError(f"no name accepted: {names}")


def scan(folder: Path, fmt: str, env: dict, *args: str) -> bytes:
    result = run_cli("scan", ".", "--select", "LA101", "--output-format", fmt, *args, cwd=folder, env=env)
    assert result.returncode == 1, result.err
    return result.stdout


def on_stream(text: str, environment: str) -> str:
    """`text` as a terminal format writes it to the environment's stream: what ASCII lacks as
    Python's backslash escapes."""
    return text.encode("ascii", "backslashreplace").decode("ascii") if environment == "ascii" else text


def decoded(stdout: bytes, env: dict) -> str:
    """The output, decoded strictly in the stream's encoding (a report must be valid text)."""
    if env.get("PYTHONIOENCODING") == "ascii":
        assert stdout.isascii()
    return stdout.decode("utf-8")


def github_commands(text: str) -> list[tuple[str, dict[str, str], str]]:
    """The workflow commands in `text`, read as the Actions runner reads them: line by line (.NET's
    ReadLine ends a line at \\r, \\n or \\r\\n), then ActionCommand.TryParseV2 with its unescaping
    order (actions/runner, src/Runner.Common/ActionCommand.cs)."""

    def unescape(value: str, mappings: list[tuple[str, str]]) -> str:
        for escaped, character in mappings:
            value = value.replace(escaped, character)
        return value

    data_mappings = [("%0D", "\r"), ("%0A", "\n"), ("%25", "%")]
    property_mappings = [("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")]
    commands = []
    for line in filter(None, re.split(r"\r\n|\r|\n", text)):
        message = line.lstrip()
        assert message.startswith("::"), line
        end = message.index("::", 2)
        name, _, properties_text = message[2:end].partition(" ")
        properties = {}
        for pair in properties_text.strip().split(","):
            key, _, value = pair.partition("=")
            properties[key] = unescape(value, property_mappings)
        commands.append((name, properties, unescape(message[end + 2 :], data_mappings)))
    return commands


def count_findings(fmt: str, text: str) -> int:
    """Parses `text` as `fmt` and counts its findings; fails where it does not parse."""
    if fmt == "json" or fmt == "gitlab":
        return len(json.loads(text))
    if fmt == "sarif":
        document = json.loads(text)
        errors = [f"{list(e.path)}: {e.message}" for e in sarif_validator().iter_errors(document)]
        assert errors == []
        return len(document["runs"][0]["results"])
    if fmt == "junit":
        return len(ElementTree.fromstring(text).findall("./testsuite/testcase/failure"))
    if fmt == "github":
        return len(github_commands(text))
    if fmt == "concise":  # one line per finding, and `scan`'s summary
        lines = [line for line in text.splitlines() if not line.startswith("Found ")]
        assert all(re.search(r":\d+:\d+: LA\d{3} ", line) for line in lines)
        return len(lines)
    return len(re.findall(r"^ *\| +\^+ LA101$", text, re.MULTILINE))


@pytest.mark.parametrize("environment", ENVIRONMENTS)
@pytest.mark.parametrize("fmt", ["json", "sarif", "gitlab", "junit", "github", "concise", "full"])
def test_every_format_reports_every_file_in_every_stream_encoding(project, fmt, environment):
    folder, names = project
    env = ENVIRONMENTS[environment]
    text = decoded(scan(folder, fmt, env), env)
    assert count_findings(fmt, text) == len(names)
    if fmt in ("concise", "full"):
        # Nothing from the files moves the cursor or breaks a line: no control character but the newlines.
        assert re.findall(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text.replace("\t", "")) == []


def test_json_names_each_file_as_it_is_and_keeps_the_code_exact(project):
    folder, names = project
    findings = json.loads(scan(folder, "json", UTF8))
    assert sorted(f["filename"] for f in findings) == sorted(shown(raw) for raw in names)
    assert {f["message"].split("`")[1] for f in findings} == {'loss.mean(dim="\x1b[2J \x7f\x01\ufffe\x9b").item()'}


def test_sarif_uris_are_percent_encoded_exact_bytes(project):
    folder, names = project
    document = json.loads(scan(folder, "sarif", UTF8))
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in document["runs"][0]["results"]]
    assert sorted(urllib.parse.unquote_to_bytes(uri) for uri in uris) == sorted(names)
    for uri in uris:  # relative references: no scheme (`co:`), no authority, no query, no fragment
        assert urllib.parse.urlsplit(uri)[:2] == ("", "") and "?" not in uri and "#" not in uri
    assert "rate%2525.py" in uris and "bad%FFname.py" in uris and "bad%5Cxffname.py" in uris


def test_the_sarif_check_sees_a_raw_file_name():
    """The schema check is not vacuous about URIs: `uri-reference` formats are checked (jsonschema
    needs rfc3986-validator or rfc3987 for that)."""
    assert "uri-reference" in jsonschema.FormatChecker().checkers
    for raw in ("space name.py", "lt<gt>.py", "café.py", "bad\udcffname.py"):
        assert not jsonschema.FormatChecker().conforms(raw, "uri-reference")


def test_fingerprints_are_those_of_the_exact_bytes_in_every_format(project):
    folder, names = project
    sarif = json.loads(scan(folder, "sarif", UTF8))["runs"][0]["results"]
    gitlab = json.loads(scan(folder, "gitlab", UTF8))
    by_uri = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: r["partialFingerprints"]["loopaudit/v1"]
        for r in sarif
    }
    assert [r["partialFingerprints"]["loopaudit/v1"] for r in sarif] == [issue["fingerprint"] for issue in gitlab]
    assert len(set(by_uri.values())) == len(names)  # the two names shown alike are two findings
    assert by_uri == {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]: r["partialFingerprints"]["loopaudit/v1"]
        for r in json.loads(scan(folder, "sarif", ENVIRONMENTS["C-locale"]))["runs"][0]["results"]
    }


def test_a_baseline_of_any_names_hides_them_all(project, tmp_path):
    folder, names = project
    baseline = tmp_path / "baseline.json"
    written = run_cli("scan", ".", "--select", "LA101", "--write-baseline", str(baseline), cwd=folder, env=UTF8)
    assert written.returncode == 0, written.err
    assert baseline.read_bytes().isascii()
    document = json.loads(baseline.read_bytes())
    assert sorted(entry["filename"] for entry in document["findings"]) == sorted(shown(raw) for raw in names)
    sarif = json.loads(scan(folder, "sarif", UTF8))["runs"][0]["results"]
    assert {entry["fingerprint"] for entry in document["findings"]} == {
        r["partialFingerprints"]["loopaudit/v1"] for r in sarif
    }
    kept = run_cli("scan", ".", "--select", "LA101", "--baseline", str(baseline), cwd=folder, env=ENVIRONMENTS["ascii"])
    assert kept.returncode == 0 and f"not shown: {len(names)} in the baseline" in kept.out


def test_github_annotations_carry_every_name_through_the_runners_unescaping(project):
    folder, names = project
    commands = github_commands(scan(folder, "github", UTF8).decode("utf-8"))
    assert sorted(properties["file"] for _, properties, _ in commands) == sorted(shown(raw) for raw in names)
    for name, properties, data in commands:
        assert (name, properties["line"], properties["col"], properties["title"]) == (
            "warning",
            "7",
            "11",
            "loopaudit LA101",
        )
        assert data.startswith('LA101 `loss.mean(dim="\x1b[2J')


def test_junit_shows_what_xml_cannot_carry_as_control_pictures(project):
    folder, names = project
    root = ElementTree.fromstring(scan(folder, "junit", UTF8))
    assert sorted(suite.get("name") for suite in root.findall("testsuite")) == sorted(
        shown(raw).replace("\x1b", "\u241b") for raw in names
    )
    messages = {failure.get("message") for failure in root.iter("failure")}
    assert {message.split("`")[1] for message in messages} == {'loss.mean(dim="\u241b[2J \x7f\u2401\ufffd\x9b").item()'}


@pytest.mark.parametrize("environment", ["utf-8", "ascii"])
def test_terminal_formats_show_names_and_code_without_control_characters(project, environment):
    folder, _ = project
    env = ENVIRONMENTS[environment]
    concise = decoded(scan(folder, "concise", env), env)
    full = decoded(scan(folder, "full", env), env)
    for name in (
        "bad\\xffname.py",
        "esc\u241b[31mname.py",
        "new\u240aline.py",
        "cr\u240dname.py",
        "[bold]markup[red].py",
        "café 日本.py",
    ):
        assert f"{on_stream(name, environment)}:7:11: LA101 " in concise
        assert f"{on_stream(name, environment)}:7:11: LA101 " in full
    # The source line is shown with its control characters as pictures, and the underline still
    # starts under `loss`.
    source, underline = re.search(r"^7 \| (.*)\n *\| (.*) LA101$", full, re.MULTILINE).groups()
    assert source.startswith(on_stream('    print(loss.mean(dim="\u241b[2J', environment))
    assert underline.index("^") == source.index("loss") and underline.endswith("^")


def test_an_ascii_stream_gets_the_reports_own_symbols_in_ascii(tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch\nfrom steps import train_step\nmodel = torch.nn.Linear(4, 2).cuda()\n"
        "for x, y in loader:\n    train_step(model, x)\n"
    )
    (tmp_path / "steps.py").write_text(
        "import torch\ndef train_step(model, x):\n    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n    print(loss.item())\n"
    )
    result = run_cli("scan", ".", "--select", "LA101", cwd=tmp_path, env=ENVIRONMENTS["ascii"])
    assert result.returncode == 1 and result.stdout.isascii()
    assert "-> `train_step()` (train.py:5)" in result.out


# A CPU-only trace, itself named with a byte that is not UTF-8, whose Python frames name a hostile
# file: rich's markup (`[/y]` closes no tag), a terminal escape, GitHub's and URIs' special characters.
TRACE_FILE = "hostile\x1b[31m:,%25 [bold]x[/y].py"


def hostile_trace(folder: Path) -> bytes:
    events = []
    for step in range(4):
        start = step * 1000
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "ts": start,
                "dur": 900,
                "pid": 1,
                "tid": 1,
            },
            {
                "ph": "X",
                "cat": "python_function",
                "name": f"{TRACE_FILE}(12): train",
                "ts": start + 10,
                "dur": 500,
                "pid": 1,
                "tid": 1,
            },
            {"ph": "X", "cat": "cpu_op", "name": "aten::item\x1b[2J", "ts": start + 20, "dur": 300, "pid": 1, "tid": 1},
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::_local_scalar_dense",
                "ts": start + 30,
                "dur": 200,
                "pid": 1,
                "tid": 1,
            },
        ]
    return write_first_accepted(folder, [b"trace\xff\x1b.json", b"trace\x1b.json"], json.dumps({"traceEvents": events}))


@pytest.mark.parametrize("environment", ["utf-8", "ascii"])
@pytest.mark.parametrize("fmt", ["json", "sarif", "gitlab", "junit", "github", "concise", "full"])
def test_analyze_reports_a_trace_of_hostile_names_in_every_format(tmp_path, fmt, environment):
    env = ENVIRONMENTS[environment]
    trace = hostile_trace(tmp_path)
    result = run_cli("analyze", os.fsdecode(trace), "--output-format", fmt, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.err
    text = decoded(result.stdout, env)
    if fmt == "json":
        document = json.loads(text)
        assert document["trace"] == shown(trace)
        assert [f["filename"] for f in document["findings"]] == [TRACE_FILE]
    elif fmt == "full":  # the measured report: its tables, its findings
        assert on_stream("hostile\u241b[31m:,%25 [bold]x[/y].py:12", environment) in text
        assert on_stream("aten::item\u241b[2J", environment) in text
        assert re.findall(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text) == []
    else:
        assert count_findings(fmt, text) == 1


RUN_SCRIPT = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(4000, 8), torch.randn(4000, 1)), batch_size=8)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total = loss.item()
""")


@pytest.mark.slow
def test_run_reports_a_script_of_a_hostile_name_on_an_ascii_stream(tmp_path):
    pytest.importorskip("torch", reason="`loopaudit run` needs torch")
    raw = write_first_accepted(tmp_path, [b"run\xff\x1b[bold].py", b"run\x1b[bold].py"], RUN_SCRIPT)
    env = ENVIRONMENTS["ascii"]
    full = run_cli("run", os.fsdecode(raw), "--warmup", "2", "--steps", "6", cwd=tmp_path, env=env)
    assert full.returncode == 1 and full.stdout.isascii(), full.err
    where = on_stream(shown(raw).replace("\x1b", "\u241b"), "ascii")  # ESC as its control picture
    # The headline, the sync sites' and the loaders' tables, the findings, the bars in ASCII.
    assert f"loopaudit run: {where} on cpu" in full.out and f"{where}:13 " in full.out and f"{where}:4 " in full.out
    assert re.search(rf"^{re.escape(where)}:\d+:1: LA60\d ", full.out, re.MULTILINE) and "######" in full.out
    measured = run_cli(
        "run", os.fsdecode(raw), "--warmup", "2", "--steps", "6", "--output-format", "json", cwd=tmp_path, env=env
    )
    document = json.loads(decoded(measured.stdout, env))
    assert document["script"] == shown(raw) and {f["filename"] for f in document["findings"]} == {shown(raw)}


@pytest.mark.parametrize("environment", ["utf-8", "ascii"])
def test_diff_shows_a_fix_in_a_file_of_any_name(tmp_path, environment):
    """`--diff` wrote the diff raw: a name that is not UTF-8 was a UnicodeEncodeError."""
    fixable = "import torch\nmodel.cuda()\nfor x in loader:\n    model(x.cuda()).sum().backward()\n"
    raw = write_first_accepted(tmp_path, [b"bad\xffname.py", b"bad\x1bname.py"], fixable)
    env = {"PYTHONIOENCODING": environment}
    result = run_cli("scan", ".", "--diff", "--no-cache", cwd=tmp_path, env=env)
    assert result.returncode == 1, result.err
    text = decoded(result.stdout, env)
    assert f"--- a/{shown(raw)}" in text and "+    model(x.cuda(non_blocking=True)).sum().backward()" in text
