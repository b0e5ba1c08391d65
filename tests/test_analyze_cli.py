"""`loopaudit analyze` through the installed command, on the real GPU traces in ../shared/traces/,
against the numbers other tools recorded for the same files (that folder's README):

- TensorBoard's profiler plugin: DataLoader 33.37% (num_workers=0) and 0.84% (num_workers=4) of the
  step. Tolerance: 1 point of the step, because tb_plugin's step boundaries are not the raw
  ProfilerStep#N intervals this reader uses.
- HolisticTraceAnalysis 0.5.0: GPU idle 39.43% (327 463 us of 830 494) and 24.32%. Tolerance: 0.1
  point, since both compute the same quantity over the same steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_cli

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"the real GPU traces are not here ({TRACES}); CI has them")
RESNET_NW0 = "kineto-tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
RESNET_NW4 = "kineto-tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
EVENT_SYNC = "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"
ROCM = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
CPU_ONLY = "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
TINY_2021 = "kineto-tb_plugin/test/gpu_metrics_input.json"


def analyze(name: str) -> tuple[int, dict]:
    result = run_cli("analyze", str(TRACES / name), "--output-format", "json")
    return result.returncode, json.loads(result.out)


def by_code(document: dict, code: str) -> list[dict]:
    return [finding for finding in document["findings"] if finding["code"] == code]


def test_resnet50_with_a_single_process_loader():
    status, document = analyze(RESNET_NW0)
    assert status == 1
    assert document["device"] == "Tesla V100-DGXS-32GB" and document["steps_measured"] == 6
    assert document["data_wait_fraction"] == pytest.approx(0.3337, abs=0.01)
    assert document["gpu_idle_fraction"] == pytest.approx(0.3943, abs=0.001)
    (stall,) = by_code(document, "LA602")
    assert "_SingleProcessDataLoaderIter" in stall["message"] and "num_workers" in stall["suggestion"]
    (idle,) = by_code(document, "LA605")
    assert idle["observed"]["time_ms"] == pytest.approx(327.463, rel=0.01)
    # Two blocking, pageable copies per step, both at the script's line 44 (`.to(device)`).
    (sync,) = by_code(document, "LA601")
    (pageable,) = by_code(document, "LA603")
    for finding in (sync, pageable):
        assert (finding["filename"], finding["location"]["row"]) == ("resnet50_profiler_api.py", 44)
        assert finding["observed"]["per_step"] == 2 and finding["observed"]["total"] == 12


def test_resnet50_with_four_workers_has_no_loader_stall():
    _, document = analyze(RESNET_NW4)
    assert document["data_wait_fraction"] == pytest.approx(0.0084, abs=0.01)
    assert document["gpu_idle_fraction"] == pytest.approx(0.2432, abs=0.001)
    assert by_code(document, "LA602") == []
    assert len(by_code(document, "LA603")) == 1  # the copies are as pageable as before


def test_a_sync_is_a_runtime_call_not_an_operator_name():
    # `.item()` on a CPU tensor in a GPU trace: `_local_scalar_dense` with no copy under it.
    _, tiny = analyze(TINY_2021)
    assert {site["call"] for site in tiny["syncs"]} == {"cudaStreamSynchronize"}
    # `if x.sum() > 0` on the GPU: the stream sync under `aten::is_nonzero` is proven.
    _, event_sync = analyze(EVENT_SYNC)
    calls = {site["call"]: site for site in event_sync["syncs"]}
    assert set(calls) == {"cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize"}
    assert calls["cudaStreamSynchronize"]["operator"] == "aten::is_nonzero" and calls["cudaStreamSynchronize"]["proven"]
    assert event_sync["gpu_idle_fraction"] == pytest.approx(0.7871, abs=0.001)


def test_rocm_names_and_cpu_only_traces():
    _, rocm = analyze(ROCM)
    assert [site["call"] for site in rocm["syncs"]] == ["hipMemcpyWithStream"]
    status, cpu_only = analyze(CPU_ONLY)
    assert status == 0 and cpu_only["findings"] == [] and cpu_only["gpu_idle_fraction"] is None


@pytest.mark.parametrize(
    "name", sorted(str(path.relative_to(TRACES)) for path in TRACES.rglob("*.json*")) if TRACES.is_dir() else []
)
def test_every_real_trace_renders_in_the_terminal(name):
    result = run_cli("analyze", str(TRACES / name), "--no-color")
    assert result.returncode in (0, 1), result.err
    assert "Step time" in result.out
    assert ("Findings" in result.out) == (result.returncode == 1)


def test_exit_zero_and_select():
    result = run_cli(
        "analyze", str(TRACES / RESNET_NW0), "--select", "LA602", "--exit-zero", "--output-format", "concise"
    )
    assert result.returncode == 0
    assert [line.split()[1] for line in result.out.splitlines() if " LA6" in line] == ["LA602"]


def test_a_trace_with_nothing_to_report_says_so_in_concise_output():
    result = run_cli("analyze", str(TRACES / RESNET_NW4), "--select", "LA602", "--output-format", "concise")
    assert (result.returncode, result.out) == (0, "All checks passed: no findings in the trace.\n")


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "notes.json").write_text("these are not JSON")
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    for name, message in [("missing.json", "missing.json"), ("notes.json", "not"), ("list.json", "trace")]:
        result = run_cli("analyze", name, cwd=tmp_path)
        assert result.returncode == 2, (name, result.err)
        assert result.err.startswith("loopaudit: error:") and message in result.err
