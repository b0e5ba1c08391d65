"""`loopaudit analyze`'s reading of real torch.profiler traces, checked against what other tools
recorded for the same files (the table in ../shared/traces/README.md)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from loopaudit.profiling.in_loopaudit.trace import TraceError, load_trace
from loopaudit.profiling.in_loopaudit.trace_analysis import analyze_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"the real GPU traces are not here ({TRACES}); CI has them"
)
RESNET_NW0 = "kineto-tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
RESNET_NW4 = "kineto-tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"


def analysis(name: str):
    return analyze_trace(load_trace(TRACES / name))


@needs_traces
@pytest.mark.parametrize(
    ("name", "tb_plugin_share"),
    [(RESNET_NW0, 0.3337), (RESNET_NW4, 0.0084)],
)
def test_dataloader_share_matches_tensorboard_profiler_plugin(name, tb_plugin_share):
    # tb_plugin's own step boundaries differ slightly from ProfilerStep#N: within 1 point of the step.
    assert analysis(name).dataloader_fraction == pytest.approx(tb_plugin_share, abs=0.01)


@needs_traces
@pytest.mark.parametrize(
    ("name", "hta_idle"),
    [
        (RESNET_NW0, 0.3943),
        (RESNET_NW4, 0.2432),
        ("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz", 0.9949),
        ("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz", 0.7871),
    ],
)
def test_gpu_idle_share_matches_holistic_trace_analysis(name, hta_idle):
    assert analysis(name).gpu_idle_fraction == pytest.approx(hta_idle, abs=0.001)


@needs_traces
def test_blocking_copies_of_the_2021_trace_are_attributed_to_the_script_line():
    result = analysis(RESNET_NW0)
    assert result.device == "Tesla V100-DGXS-32GB"
    assert len(result.steps) == 6
    stream_syncs = [s for s in result.syncs if s.call == "cudaStreamSynchronize"]
    assert [(s.operator, str(s.frame), s.count) for s in stream_syncs] == [
        ("aten::to", "resnet50_profiler_api.py:44", 12)
    ]
    (copies,) = result.copies
    assert (copies.kind, copies.count, copies.bytes) == ("HtoD pageable", 12, 115607040)


@needs_traces
def test_a_sync_is_proven_by_a_runtime_call_not_by_the_operator_name():
    # `.item()` of a CPU tensor in a GPU trace has no cudaStreamSynchronize under it: no sync.
    result = analysis("kineto-tb_plugin/test/gpu_metrics_input.json")
    assert all(site.operator != "aten::item" for site in result.syncs)
    # `if x.sum() > 0` on the GPU: is_nonzero -> item -> _local_scalar_dense -> cudaStreamSynchronize.
    event_sync = analysis("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz")
    assert ("cudaStreamSynchronize", "aten::is_nonzero") in {(s.call, s.operator) for s in event_sync.syncs}


@needs_traces
def test_rocm_and_cpu_only_traces():
    rocm = analysis("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert {s.call for s in rocm.syncs} >= {"hipMemcpyWithStream"}
    cpu = analysis("local-cpu-torch2.13/cpu_nw0_slowds_stack.json.gz")
    assert cpu.device == "cpu" and cpu.gpu_idle_fraction is None
    (item,) = cpu.syncs
    assert (item.operator, item.count, item.proven) == ("aten::item", 3, False)
    assert 0.40 < cpu.dataloader_fraction < 0.55  # the README: 43-54 % of each step
    assert analysis("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz").syncs == []


def test_files_that_are_not_traces_raise_a_clear_error(tmp_path):
    cases = {
        "missing.json": None,
        "text.json": b"not json",
        "list.json": b'{"traceEvents": 3}',
        "bad.json.gz": b"\x1f\x8b broken",
        "empty.json": b'{"traceEvents": []}',
    }
    for name, data in cases.items():
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        with pytest.raises(TraceError) as error:
            load_trace(path)
        assert name in str(error.value)


def test_a_gzipped_trace_reads_like_the_plain_one(tmp_path):
    document = (
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}'
    )
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(document)
    packed.write_bytes(gzip.compress(document))
    assert [e.name for e in load_trace(plain).events] == [e.name for e in load_trace(packed).events] == ["aten::mm"]


def test_the_probes_own_frames_are_not_the_scripts_line(tmp_path):
    """A trace that `loopaudit run --profile` recorded (seen on an H100, docs/gpu-validation.md) holds
    loopaudit's wrappers between the script and torch: the sync belongs to the script's frame."""
    import json

    def event(name: str, cat: str, ts: float, dur: float, **args) -> dict:
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}

    events = [
        event("ProfilerStep#1", "user_annotation", 0, 100),
        event("train.py(12): <module>", "python_function", 1, 98),
        event("loopaudit/profiling/spy.py(244): make", "python_function", 10, 80),
        event("aten::item", "cpu_op", 20, 60),
        event("cudaStreamSynchronize", "cuda_runtime", 30, 40, correlation=7),
        {
            "ph": "X",
            "name": "Memcpy DtoH (Device -> Pageable)",
            "cat": "gpu_memcpy",
            "ts": 40,
            "dur": 5,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 7, "bytes": 4},
        },
    ]
    path = tmp_path / "run.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100"}]}))
    (site,) = analyze_trace(load_trace(path)).syncs
    assert (site.call, site.operator, str(site.frame)) == ("cudaStreamSynchronize", "aten::item", "train.py:12")
