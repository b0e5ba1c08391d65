"""`loopaudit analyze` on files that are not profiler traces, or are traces larger than memory would
hold whole: a one-line error and exit 2, or a correct analysis in bounded memory; never a traceback,
a crash or a hang (the contract in auditor/profiling/in_loopaudit/trace_stream.py). The large files are written
at runtime, in tmp_path: a gzip bomb is one compressed block written many times over."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys

import ijson
import pytest

from loopaudit.profiling.in_loopaudit import trace, trace_stream
from loopaudit.profiling.in_loopaudit.trace import TraceError, load_trace

from .conftest import loopaudit_command, run_cli

needs_wait4 = pytest.mark.skipif(not hasattr(os, "wait4"), reason="peak memory of one child process needs os.wait4")
MIB = 1 << 20


def complete_event(ts: str = "1", dur: str = "2", more: str = "") -> str:
    """A complete event as JSON text, with `ts` and `dur` written as given (NaN is not JSON)."""
    return f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": {ts}, "dur": {dur}, "pid": 1, "tid": 1{more}}}'


def trace_text(*events: str) -> str:
    return '{"traceEvents": [' + ", ".join(events) + "]}"


def write_gzip_bomb(path, head: bytes, filler: bytes, tail: bytes, size: int) -> None:
    """head, `filler` repeated to `size` bytes, tail: one compressed block written over and over (a
    gzip file may hold several members), so a 200 MB expansion takes a 0.2 MB file and no time."""
    block = gzip.compress(filler * (16 * MIB // len(filler)), compresslevel=9)
    with open(path, "wb") as out:
        out.write(gzip.compress(head))
        for _ in range(size // (16 * MIB)):
            out.write(block)
        out.write(gzip.compress(tail))


# Starts the command and prints its peak RSS. A process forked from this test process would carry the
# test process's own size into its ru_maxrss (Linux keeps the larger of the memory before and after
# exec): a pytest worker that ran a few hundred tests made a 40 MB analysis read as 460 MB. Forked
# from this small launcher instead, the command's peak is its own.
_MEASURED = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "with open(sys.argv[1], 'w') as out:\n"
    "    out.write(f'{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}')\n"
)


def analyze_measured(path, timeout: float = 120) -> tuple[int, str, str, int]:
    """`loopaudit analyze PATH --output-format json` in a fresh process: exit status, stdout, stderr,
    and the peak RSS in bytes of that process alone (os.wait4 in a small launcher, _MEASURED)."""
    measured = path.parent / "measured.txt"
    command = [
        sys.executable,
        "-c",
        _MEASURED,
        str(measured),
        *loopaudit_command(),
        "analyze",
        str(path),
        "--output-format",
        "json",
    ]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and the command it started
        launcher.communicate()
        pytest.fail(f"`loopaudit analyze` ran past {timeout} s: it hangs")
    stdout, stderr = out.decode(), err.decode()
    assert "Traceback" not in stderr, stderr
    status, peak = (int(value) for value in measured.read_text().split())
    return status, stdout, stderr, peak * (1 if sys.platform == "darwin" else 1024)


# The reproducers, through the installed command. Before the trace was read as a stream,
# Python's json took the first two as they are, and raised ValueError and RecursionError on the others.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            trace_text(complete_event(), complete_event(ts="NaN")),
            "`traceEvents[1].ts` is NaN: not a finite number",
            id="NaN",
        ),
        pytest.param(
            trace_text(complete_event(dur="Infinity")),
            "`traceEvents[0].dur` is Infinity: not a finite number",
            id="Inf",
        ),
        pytest.param(
            trace_text(complete_event(ts="1" * 5001)),
            "`traceEvents[0].ts` is an integer beyond 64 bits",
            id="5001-digits",
        ),
        pytest.param("[" * 100_000 + "]" * 100_000, "`[0]` nests deeper than 64 levels", id="100000-nested-arrays"),
    ],
)
def test_what_no_profiler_writes_is_refused_in_one_line(tmp_path, text, message):
    (tmp_path / "trace.json").write_text(text)
    result = run_cli("analyze", "trace.json", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.err.splitlines()
    assert line.startswith(f"loopaudit: error: trace.json is not a profiler trace: {message}"), line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            trace_text(complete_event(ts="-Infinity")),
            "`traceEvents[0].ts` is -Infinity: not a finite number",
            id="-Inf",
        ),
        pytest.param(
            trace_text(complete_event(ts='"NaN"')), "`traceEvents[0].ts` is 'NaN': not a finite number", id="string-NaN"
        ),
        pytest.param(
            trace_text(complete_event(dur="1e999")),
            "`traceEvents[0].dur` is a number beyond the range of a double",
            id="1e999",
        ),
        # Refused wherever it is, even where nothing is read: the parser cannot step over it.
        pytest.param(
            trace_text(complete_event(more=', "args": {"Sequence number": NaN}')),
            "`traceEvents[0].args.Sequence number` is NaN: not a finite number",
            id="NaN-in-args",
        ),
        pytest.param(
            trace_text(complete_event(more=', "args": {"Input Dims": ' + "[" * 100 + "]" * 100 + "}")),
            "`traceEvents[0].args.Input Dims` nests deeper than 64 levels",
            id="deep-args",
        ),
        pytest.param('{"schemaVersion": NaN}', "`schemaVersion` is NaN: not a finite number", id="NaN-at-the-top"),
        pytest.param(
            trace_text(complete_event()) + " x", "it is not valid JSON (parse error: trailing garbage)", id="garbage"
        ),
        pytest.param(
            trace_text(complete_event().replace("aten::mm", "\\udcff")),
            "`traceEvents[0].name` holds a string that is not Unicode text",
            id="lone-surrogate-escape",
        ),
        pytest.param(
            trace_text(complete_event().replace("aten::mm", "mm\udcff")),
            "`traceEvents[0].name` is not valid JSON (lexical error: invalid bytes in UTF8 string)",
            id="invalid-utf8",
        ),
    ],
)
def test_each_refusal_says_what_and_where(tmp_path, text, message):
    path = tmp_path / "trace.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert str(error.value).startswith(f"{path} is not a profiler trace: {message}")


def test_the_parser_refuses_what_json_does_not_allow_and_walks_deep_nesting_without_recursion():
    # What trace_stream relies on ijson (its C backend, yajl) for, with use_float=True.
    for text in (b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[" + b"1" * 5001 + b"]", b"[1e999]"):
        with pytest.raises(ijson.JSONError):
            list(ijson.basic_parse(io.BytesIO(text), use_float=True))
    deep = b"[" * 100_000 + b"]" * 100_000
    assert sum(1 for _ in ijson.basic_parse(io.BytesIO(deep), use_float=True)) == 200_000


def test_values_of_the_wrong_type_are_skipped_not_a_crash(tmp_path):
    # A list as pid made the analysis fail on an unhashable key, a string as bytes on int().
    events = [
        complete_event(more=', "args": {"Call stack": ["a list"], "correlation": 7}'),
        complete_event(ts="null"),  # no timestamp: skipped, as before
        '"a string"',
        complete_event(more=', "args": [1, 2]').replace('"pid": 1', '"pid": [1]'),
        '{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 5, "dur": 1, "pid": 0, "tid": 7, '
        '"args": {"bytes": "many"}}',
    ]
    (tmp_path / "trace.json").write_text(trace_text(*events))
    result = run_cli("analyze", "trace.json", "--output-format", "json", cwd=tmp_path)
    assert result.returncode in (0, 1), result.err
    (copy,) = json.loads(result.out)["pageable_copies"]
    assert copy["bytes"] == 0
    loaded = load_trace(tmp_path / "trace.json")
    assert [(e.name, e.pid, e.call_stack, e.correlation) for e in loaded.events] == [
        ("aten::mm", 1, None, 7),
        ("aten::mm", None, None, None),
        ("Memcpy HtoD (Pageable -> Device)", 0, None, None),
    ]


def test_a_byte_order_mark_is_read_past_plain_or_gzipped(tmp_path):
    document = b"\xef\xbb\xbf" + trace_text(complete_event()).encode()
    (tmp_path / "t.json").write_bytes(document)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(document))
    for name in ("t.json", "t.json.gz"):
        assert [event.name for event in load_trace(tmp_path / name).events] == ["aten::mm"]


def test_broken_and_empty_files_are_refused(tmp_path):
    packed = gzip.compress(trace_text(*[complete_event(ts=str(n)) for n in range(1000)]).encode())
    cases = {
        "truncated.json.gz": (packed[: len(packed) // 2], "is not a valid gzip file"),
        "empty.json": (b"", "is empty"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TraceError) as error:
            load_trace(tmp_path / name)
        assert str(error.value).startswith(f"{tmp_path / name} {message}")


def test_more_events_than_are_kept_is_refused_with_how_to_record_fewer(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "MAX_EVENTS", 3)
    path = tmp_path / "trace.json"
    path.write_text(trace_text(*[complete_event(ts=str(n)) for n in range(3)]))
    assert len(load_trace(path).events) == 3
    path.write_text(trace_text(*[complete_event(ts=str(n)) for n in range(4)]))
    with pytest.raises(TraceError, match=r"holds more than 3 complete events.*schedule\(wait=1, warmup=1, active=3\)"):
        load_trace(path)


def test_an_event_list_longer_than_is_read_is_refused_skipped_entries_too(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_stream, "MAX_ENTRIES", 5)
    path = tmp_path / "trace.json"
    path.write_text(trace_text(complete_event(), *["0"] * 4))
    assert len(load_trace(path).events) == 1
    path.write_text(trace_text(complete_event(), *["0"] * 5))
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert str(error.value).startswith(f"{path} is not a profiler trace: `traceEvents` holds more than 5 entries")
    assert "schedule(wait=1, warmup=1, active=3)" in str(error.value)


def test_more_distinct_names_than_are_kept_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "MAX_TEXT_BYTES", 1 * MIB)
    path = tmp_path / "trace.json"
    long_name = "x" * 1000
    path.write_text(trace_text(*[complete_event(ts=str(n)).replace("aten::mm", long_name) for n in range(2000)]))
    assert len(load_trace(path).events) == 2000  # 2 MB of names, but one name: held once
    path.write_text(
        trace_text(*[complete_event(ts=str(n)).replace("aten::mm", f"{n:08}{long_name}") for n in range(2000)])
    )
    with pytest.raises(TraceError, match="come to more than 1 MiB of distinct text"):
        load_trace(path)


def test_a_value_larger_than_any_profiler_writes_is_refused_before_it_is_held_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_stream, "MAX_VALUE_BYTES", 1 * MIB)
    path = tmp_path / "trace.json"
    path.write_text(trace_text(complete_event(), complete_event().replace("aten::mm", "x" * (3 * MIB))))
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert str(error.value) == (
        f"{path} is not a profiler trace: `traceEvents[1].name` runs past 1 MiB without ending: no profiler writes a value that large"
    )


@needs_wait4
def test_a_gzip_bomb_of_whitespace_stops_early_in_bounded_memory(tmp_path):
    path = tmp_path / "bomb.json.gz"
    write_gzip_bomb(path, b'{"traceEvents": [', b" " * 4096, b"]}", 200 * MIB)
    status, _, stderr, peak = analyze_measured(path)
    assert status == 2
    assert f"`traceEvents[0]` runs past {trace_stream.MAX_VALUE_BYTES >> 20} MiB without ending" in stderr
    assert peak < 150 * MIB  # the old reader held the whole 200 MB and more: 420 MB


@needs_wait4
def test_a_large_trace_is_analysed_in_bounded_memory_with_the_right_numbers(tmp_path):
    # 1,000 steps of 1 ms: the DataLoader waits 0-250 us, a kernel runs 300-900 us; each step's
    # ProfilerStep carries a 200 KB arg that nothing reads. 200 MB once decompressed.
    path = tmp_path / "large.json.gz"
    padding = "x" * (200 * 1024)
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write('{"traceEvents": [\n')
        for step in range(1000):
            start = step * 1000
            out.write(
                ("" if step == 0 else ",\n")
                + f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "ts": {start}, "dur": 1000, '
                f'"pid": 1, "tid": 1, "args": {{"padding": "{padding}"}}}},\n'
                f'{{"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", '
                f'"ts": {start}, "dur": 250, "pid": 1, "tid": 1}},\n'
                f'{{"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm", "ts": {start + 300}, "dur": 600, "pid": 0, "tid": 7}}'
            )
        out.write('\n], "deviceProperties": [{"name": "NVIDIA H100"}]}\n')
    status, stdout, _, peak = analyze_measured(path)
    document = json.loads(stdout)
    assert status == 1  # the loader stall and the idle GPU are findings
    assert (document["device"], document["steps_measured"]) == ("NVIDIA H100", 1000)
    assert document["data_wait_fraction"] == pytest.approx(0.25)
    # Idle 400 of every 1,000 us, over the steps before the last (HolisticTraceAnalysis's measure).
    assert document["gpu_idle_fraction"] == pytest.approx(399_200 / 998_600, abs=1e-4)
    assert peak < 150 * MIB  # the old reader: 630 MB
