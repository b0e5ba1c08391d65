"""`loopaudit run`, driven as a user drives it: the installed command runs real training scripts
(written here, never seen by the rules' authors) on this machine's CPU and is judged on what it says.

The scripts are small and the windows short (`--warmup 2 --steps 6` unless the test is about the
defaults), so each run costs a couple of seconds, most of it torch's import.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out

pytest.importorskip("torch", reason="`loopaudit run` needs torch (pip install 'loopaudit[profile]')")

# Exactly 6 measured steps: the window does not go on past them (--max-steps), so that counts are
# the same on a busy machine, where a transient would otherwise lengthen it.
SHORT = ("--warmup", "2", "--steps", "6", "--max-steps", "6")

# The first check: a slow single-process dataset, a per-step `.item()` and `torch.nonzero`.
# The script counts its own steps in a file, so the test can tell how far it really got. Its data
# waits are sleeps and its step is tiny and single-threaded, so that the waits stay most of the step
# on a busy machine too: with torch's two intra-op threads on a busy 2-CPU machine, the threads wait
# for each other and the 1 ms step took 50 ms.
SLOW_LOADER = textwrap.dedent("""\
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Decoded(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            time.sleep(0.012)  # reading and decoding a sample (a sleep takes as long on a busy machine)
            return torch.randn(32), index % 10


    def main():
        torch.set_num_threads(1)
        model = torch.nn.Linear(32, 10)
        optimizer = torch.optim.Adam(model.parameters())
        loader = DataLoader(Decoded(), batch_size=8)
        with open("steps.log", "w") as log:
            for epoch in range(10):
                for x, y in loader:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    value = loss.item()
                    kept = torch.nonzero(y)
                    log.write(f"{value}\\n")
                    log.flush()


    if __name__ == "__main__":
        main()
""")
ITEM_LINE, NONZERO_LINE, LOADER_LINE = 27, 28, 19

# The second check: workers that keep up, and a loss read every 10 steps only.
CLEAN_LOOP = textwrap.dedent("""\
    import argparse
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from helpers import log


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=0.1)
        parser.add_argument("--context", default="fork")
        args = parser.parse_args()
        print(f"started with lr={args.lr} context={args.context} data={open('data.txt').read().strip()}")
        data = TensorDataset(torch.randn(20_000, 64), torch.randint(0, 10, (20_000,)))
        loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True,
                            multiprocessing_context=args.context)
        model = torch.nn.Sequential(torch.nn.Linear(64, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                    torch.nn.ReLU(), torch.nn.Linear(2048, 10))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        step = 0
        for epoch in range(50):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if step % 10 == 0:
                    log(step, loss.item())
                step += 1


    if __name__ == "__main__":
        main()
""")
PERIODIC_ITEM_LINE = 28

FAILS_AT_STEP_5 = SLOW_LOADER.replace(
    "                log.flush()\n",
    "                log.flush()\n"
    "                main.steps = getattr(main, 'steps', 0) + 1\n"
    "                if main.steps == 5:\n"
    "                    raise ValueError('corrupt batch')\n",
)


def write_script(folder: Path, text: str, name: str = "train.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(text)
    return script


# These tests check the CPU path, what CI runs: on a machine with a GPU too, the scripts see none (a
# CPU tensor's `.item()` is then no sync at all, and there is no stall time to measure).
CPU_PATH = {"CUDA_VISIBLE_DEVICES": ""}


def run_json(folder: Path, *args: str, script: str = "train.py", script_may_fail: bool = False):
    result = run_cli(
        "run", script, *args, "--output-format", "json", cwd=folder, script_may_fail=script_may_fail, env=CPU_PATH
    )
    return result, (json.loads(result.out) if result.out.strip() else None)


def lines_of(document: dict, code: str) -> list[int]:
    return sorted(f["location"]["row"] for f in document["findings"] if f["code"] == code)


def test_slow_loader_and_per_step_syncs_are_found_at_their_lines(tmp_path):
    write_script(tmp_path, SLOW_LOADER)
    result, document = run_json(tmp_path)  # the defaults: 5 warm-up steps, 20 measured
    assert result.returncode == 1, result.err
    assert lines_of(document, "LA601") == [ITEM_LINE, NONZERO_LINE]
    assert lines_of(document, "LA602") == [LOADER_LINE]
    assert document["data_wait_fraction"] > 0.5
    (stall,) = [f for f in document["findings"] if f["code"] == "LA602"]
    assert stall["details"]["loader"]["num_workers"] == 0 and stall["observed"]["share"] > 0.5
    for finding in document["findings"]:
        if finding["code"] == "LA601":
            # Counted per measured step; no stall time without a GPU. The scan leaves CPU-only
            # scripts alone, so these are syncs it did not report.
            assert finding["observed"] == {"per_step": 1, "total": 20, "time_ms": None}
            assert finding["details"]["missed_by_scan"] is True
    # Stopped after the window: 25 of the 125 000 steps the script would take.
    assert document["stopped"] and document["steps_measured"] == 20
    taken = (tmp_path / "steps.log").read_text().splitlines()
    assert len(taken) == 24  # the 25th `optimizer.step()` closed the window and the script stopped there


def test_a_clean_loop_with_workers_and_interval_logging(tmp_path):
    write_script(tmp_path, CLEAN_LOOP)
    write_script(tmp_path, "def log(step, value):\n    print(f'step {step}: {value:.3f}')\n", "helpers.py")
    (tmp_path / "data.txt").write_text("cifar\n")
    result, document = run_json(tmp_path, *SHORT, "--steps", "20")
    assert result.returncode in (0, 1), result.err
    assert lines_of(document, "LA601") == []
    (periodic,) = document["sync_sites"]
    assert (periodic["line"], periodic["kind"], periodic["on_step_path"]) == (PERIODIC_ITEM_LINE, "item", False)
    # Two workers on a two-core machine keep up with this model, not perfectly: a small share, most of
    # it handing over batches the workers had ready, which LA602 does not count.
    assert document["data_wait_fraction"] < 0.25
    not_ready = document["estimates"]["data_wait_not_ready_fraction"]
    assert not_ready["value"] <= document["data_wait_fraction"] and not_ready["high"] < 0.05
    assert lines_of(document, "LA602") == [] and document["undecided"] == []
    time = document["estimates"]["step_time_ms"]
    assert time["value"] == document["step_time_ms"]["median"]
    # The steady steps (all 20, unless a busy machine made a run of them a transient: at least 6 stay).
    assert time["steps"] >= 6 and time["low"] <= time["value"] <= time["high"]
    # The script's own output goes to stderr when stdout carries JSON.
    assert "started with lr=0.1 context=fork data=cifar" in result.err


def test_spawned_workers_arguments_relative_imports_and_the_working_directory(tmp_path):
    write_script(tmp_path, CLEAN_LOOP)
    write_script(tmp_path, "def log(step, value):\n    print(f'step {step}: {value:.3f}')\n", "helpers.py")
    (tmp_path / "data.txt").write_text("imagenet\n")
    result = run_cli("run", "train.py", *SHORT, "--no-color", "--", "--lr", "0.05", "--context", "spawn", cwd=tmp_path)
    assert result.returncode in (0, 1), result.err
    assert "started with lr=0.05 context=spawn data=imagenet" in result.out
    assert "6 optimizer steps measured after 2 warm-up steps" in result.out
    assert "num_workers=2" in result.out


def test_a_script_that_raises_at_step_5_fails_with_its_traceback(tmp_path):
    write_script(tmp_path, FAILS_AT_STEP_5)
    result = run_cli("run", "train.py", "--no-color", cwd=tmp_path, script_may_fail=True)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.err and "ValueError: corrupt batch" in result.err
    assert f'File "{tmp_path / "train.py"}", line' in result.err  # as `python train.py` shows it
    # All 5 steps were warm-up under the defaults: nothing measured, and the message says why.
    assert "before any step was measured" in result.err


def test_a_failure_inside_the_window_still_reports_what_was_measured(tmp_path):
    # It fails at step 8, in a window of 10: the 6 steps measured before it are enough to call a sync
    # in each of them per-step (in 2 of 2 steps it would be undecided: stability.proportion_interval).
    write_script(tmp_path, FAILS_AT_STEP_5.replace("main.steps == 5", "main.steps == 8"))
    result, document = run_json(tmp_path, "--warmup", "2", "--steps", "10", "--max-steps", "10", script_may_fail=True)
    assert result.returncode == 1
    assert "ValueError: corrupt batch" in result.err
    assert document["exit_status"] == 1 and not document["window_complete"]
    assert document["steps_measured"] == 6
    assert lines_of(document, "LA601") == [ITEM_LINE, NONZERO_LINE]


@pytest.mark.parametrize(
    ("source", "status", "message"),
    [
        ("import torch\nprint('no training here')\n", 2, "the script never took a step"),
        ("import sys\nsys.exit(3)\n", 3, "ended with exit status 3 before any step was measured"),
        ("for x in loader\n    pass\n", 1, "ended with exit status 1"),
    ],
    ids=["never-steps", "exits", "does-not-parse"],
)
def test_scripts_that_measure_nothing_say_why(tmp_path, source, status, message):
    write_script(tmp_path, source)
    result = run_cli("run", "train.py", cwd=tmp_path, script_may_fail=True)
    assert result.returncode == status
    assert message in result.err
    assert result.out.strip() == "" or "Findings" not in result.out


def test_a_short_script_is_measured_as_far_as_it_goes(tmp_path):
    write_script(
        tmp_path,
        textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
    """),
    )
    result, document = run_json(tmp_path, *SHORT)
    assert result.returncode == 0, result.err
    assert document["steps_measured"] == 2 and not document["window_complete"] and not document["stopped"]
    assert document["data_wait_fraction"] is None  # no DataLoader: not measured, not zero
    assert all(step["sync_stall_ms"] is None for step in document["steps"])  # no GPU: unknown


def test_json_document_shape(tmp_path):
    write_script(tmp_path, SLOW_LOADER)
    _, document = run_json(tmp_path, *SHORT)
    for key in ("device", "steps_measured", "step_time_ms", "data_wait_fraction", "findings", "static"):
        assert key in document
    assert document["device"] == "cpu" and document["cuda"] is False
    assert set(document["step_time_ms"]) == {"median", "p90"}
    assert document["step_time_ms"]["median"] <= document["step_time_ms"]["p90"]
    for finding in document["findings"]:
        assert {"code", "message", "filename", "location", "end_location", "observed", "url"} <= set(finding)
        assert {"per_step", "total", "time_ms"} <= set(finding["observed"])
    assert len(document["steps"]) == 6


def test_static_findings_are_confirmed_by_the_run(tmp_path):
    # Written for a GPU, run on this CPU: the scan flags the `.item()`, the run confirms it.
    script = SLOW_LOADER.replace(
        "    model = torch.nn.Linear(32, 10)\n",
        "    device = 'cuda' if torch.cuda.is_available() else 'cpu'\n    model = torch.nn.Linear(32, 10).to(device)\n",
    ).replace(
        "loss = torch.nn.functional.cross_entropy(model(x), y)",
        "loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))",
    )
    write_script(tmp_path, script)
    scan = run_cli("scan", "train.py", "--output-format", "json", cwd=tmp_path)
    scanned = {(f["code"], f["location"]["row"]) for f in json.loads(scan.out)}
    assert ("LA101", ITEM_LINE + 1) in scanned
    _, document = run_json(tmp_path, *SHORT)
    static = {(f["code"], f["location"]["row"]): f for f in document["static"]}
    assert set(static) == scanned
    item = static[("LA101", ITEM_LINE + 1)]
    assert item["confirmed"] is True and item["measurable"] is True
    assert item["measurement"] == {"code": "LA601", "observed": {"per_step": 1, "total": 6, "time_ms": None}}
    (sync,) = [f for f in document["findings"] if f["code"] == "LA601" and f["location"]["row"] == ITEM_LINE + 1]
    assert sync["details"]["static"] == ["LA101"] and not sync["details"]["missed_by_scan"]
    assert [check["code"] for check in document["static"]].count("LA101") == 1


def test_profile_writes_a_trace_that_analyze_reads(tmp_path):
    write_script(tmp_path, SLOW_LOADER)
    (tmp_path / "train.pt.trace.json").write_text("{}")  # an earlier trace: never overwritten
    result = run_cli("run", "train.py", *SHORT, "--profile", "--no-color", cwd=tmp_path)
    assert result.returncode == 1, result.err
    assert (tmp_path / "train.pt.trace.json").read_text() == "{}"
    trace = tmp_path / "train.1.pt.trace.json"
    assert f"Trace of the measured steps: {trace}" in result.out
    analyzed = run_cli("analyze", str(trace), "--output-format", "json", cwd=tmp_path)
    document = json.loads(analyzed.out)
    # The profiler's schedule covers the measured window: its steps, its DataLoader waits.
    assert document["steps_measured"] == 6
    assert document["data_wait_fraction"] > 0.5
    assert "LA602" in {f["code"] for f in document["findings"]}


def test_trace_out_names_the_file_and_implies_profile(tmp_path):
    write_script(tmp_path, SLOW_LOADER)
    result, document = run_json(tmp_path, *SHORT, "--trace-out", "out/window.json.gz")
    assert result.returncode == 2 and "does not exist" in result.err and document is None
    result, document = run_json(tmp_path, *SHORT, "--trace-out", ".")
    assert result.returncode == 2 and "is a folder" in result.err and document is None
    (tmp_path / "out").mkdir()
    result, document = run_json(tmp_path, *SHORT, "--trace-out", "out/window.json.gz")
    assert result.returncode == 1, result.err
    assert document["trace"] == str(tmp_path / "out" / "window.json.gz")
    assert (tmp_path / "out" / "window.json.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip, as asked


def test_timeout_reports_what_was_measured(tmp_path):
    # 5 steps, then one that hangs: the count measured by the timeout does not depend on the machine's
    # speed, and the timeout can be generous (the 5 steps take milliseconds).
    write_script(
        tmp_path,
        textwrap.dedent("""\
        import time
        import torch
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1000):
            if step == 5:
                time.sleep(3600)
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
    """),
    )
    result, document = run_json(tmp_path, "--warmup", "0", "--steps", "500", "--timeout", "8")
    assert result.returncode == 0, result.err
    assert document["timed_out"] and not document["window_complete"]
    assert document["steps_measured"] == 4  # step 1 ran from the script's start: left out
    assert "interrupted at --timeout" in result.err


def test_with_no_warmup_the_start_up_is_not_a_measured_step(tmp_path):
    # Step 1 of a loop without a DataLoader runs from the script's start: 1 s of start-up here.
    write_script(
        tmp_path,
        textwrap.dedent("""\
        import time
        import torch
        time.sleep(1.0)
        torch.set_num_threads(1)  # a tiny step, on a busy machine too (see SLOW_LOADER)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
    """),
    )
    result, document = run_json(tmp_path, "--warmup", "0", "--steps", "3")
    assert result.returncode == 0, result.err
    assert document["steps_measured"] == 3 and document["window_complete"]
    assert max(step["time_ms"] for step in document["steps"]) < 900  # not the second of start-up
    result = run_cli("run", "train.py", "--warmup", "0", "--steps", "3", cwd=tmp_path)
    assert "Step 1 ran from the script's start" in result.out


def test_a_slow_start_is_left_out_as_a_transient_and_the_window_goes_on(tmp_path):
    # Steps 3 to 8 sleep 150 ms (a cache warming that outlasts --warmup 2), the others 5 ms: sleeps,
    # so that the levels stay 30x apart on a busy machine.
    write_script(
        tmp_path,
        textwrap.dedent("""\
        import time
        import torch
        torch.set_num_threads(1)
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1000):
            time.sleep(0.15 if 2 <= step < 8 else 0.005)
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
    """),
    )
    result, document = run_json(tmp_path, "--warmup", "2", "--steps", "12")
    assert result.returncode == 0, result.err
    assert document["transient"]["steps"] == [str(step) for step in range(3, 9)]
    assert document["transient"]["slow_ms"] > 100 > 20 > document["transient"]["steady_ms"]
    # The window went on until 12 steady steps were measured, and the step time is theirs.
    assert document["steps_measured"] == 18
    assert document["estimates"]["step_time_ms"]["steps"] == 12
    assert document["step_time_ms"]["median"] < 50
    result = run_cli("run", "train.py", "--warmup", "2", "--steps", "12", "--no-color", cwd=tmp_path, env=CPU_PATH)
    assert "Steps 3-8 ran" in result.out and "transient: left out" in result.out
    assert "The window went on past the 12 steps asked for" in result.out


def test_usage_errors_exit_2_without_running_anything(tmp_path):
    result = run_cli("run", "missing.py", cwd=tmp_path)
    assert result.returncode == 2 and "no such file: missing.py" in result.err
    write_script(tmp_path, SLOW_LOADER)
    result = run_cli("run", "train.py", "--select", "LA6O1", cwd=tmp_path)
    assert result.returncode == 2 and "unknown rule code" in result.err
    assert not (tmp_path / "steps.log").exists()
