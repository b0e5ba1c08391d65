"""The dynamic mode's probe, run for real: a training script in a child process, its steps found
through the optimizer hook, its sync sites named by line, its DataLoader read live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out

pytest.importorskip("torch", reason="the dynamic mode needs torch (pip install 'loopaudit[profile]')")

SCRIPT = textwrap.dedent("""\
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            time.sleep(0.02)  # sleeping, unlike computing, takes as long on a busy machine
            return torch.randn(32), i % 10

    def main():
        torch.set_num_threads(1)  # a pool of threads waits for its descheduled members on a busy machine
        model = torch.nn.Linear(32, 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(Slow(), batch_size=8)
        for epoch in range(100):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
                value = loss.item()
                kept = torch.nonzero(y)

    if __name__ == "__main__":
        main()
""")


def run_probe(tmp_path, script_text: str, **overrides):
    script = tmp_path / "train.py"
    script.write_text(script_text)
    config = {
        "warmup": 2,
        "steps": 5,
        "profile": False,
        "trace_out": None,
        "report": str(tmp_path / "report.json"),
        "stop": True,
        **overrides,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    completed = subprocess.run(
        [sys.executable, "-m", "loopaudit.profiling.in_script.child", str(tmp_path / "config.json"), "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # the CPU path, on a machine with a GPU too
    )
    report = json.loads((tmp_path / "report.json").read_text()) if (tmp_path / "report.json").exists() else None
    return completed, report


def test_sync_sites_are_named_by_line_and_the_loader_is_read_live(tmp_path):
    completed, report = run_probe(tmp_path, SCRIPT)
    assert completed.returncode == 0, completed.stderr
    assert report["window_complete"] and report["step_kind"] == "optimizer"
    assert len(report["steps"]) == 5
    sites = {(s["kind"], s["line"]): s["count"] for s in report["syncs"]}
    assert sites == {("item", 20): 5, ("nonzero", 21): 5}
    (loader,) = report["loaders"]
    assert (loader["line"], loader["num_workers"], loader["pin_memory"]) == (15, 0, False)
    waits = sum(s["data_wait_seconds"] for s in report["steps"]) / sum(s["seconds"] for s in report["steps"])
    # 8 samples x 20 ms of loading against a tiny linear model on one thread: the waits are 160 ms a
    # step whatever the machine does, the step's compute a few ms (with 5 ms samples a busy 2-CPU
    # machine made the waits 46% of the step; with torch's default two threads the step took 50 ms).
    assert waits > 0.7
    # A single-process loader loads each batch on the step's time: every wait is one for a batch not
    # yet loaded.
    assert all(s["data_starved_seconds"] == s["data_wait_seconds"] for s in report["steps"])


def test_a_script_that_raises_at_step_5_keeps_its_traceback_and_fails(tmp_path):
    failing = SCRIPT.replace(
        "kept = torch.nonzero(y)",
        "kept = torch.nonzero(y)\n            main.steps = getattr(main, 'steps', 0) + 1\n"
        "            if main.steps == 5:\n"
        "                raise RuntimeError('boom')",
    )
    completed, _ = run_probe(tmp_path, failing)
    assert completed.returncode == 1
    assert "RuntimeError: boom" in completed.stderr and f'File "{tmp_path / "train.py"}", line' in completed.stderr
    assert "runpy" not in completed.stderr and "loopaudit" not in completed.stderr


def test_a_script_that_does_not_parse_gets_python_s_message_only(tmp_path):
    completed, _ = run_probe(tmp_path, "for x in loader\n    pass\n")
    assert completed.returncode == 1
    assert "SyntaxError" in completed.stderr and "loopaudit" not in completed.stderr


def test_the_runner_hears_of_the_steps_as_they_pass(tmp_path):
    import os

    from loopaudit.profiling.in_loopaudit.runner import RunRequest, run_script

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    seen: list[int] = []
    with open(os.devnull, "w") as quiet:
        outcome = run_script(
            RunRequest(script=str(script), warmup=2, steps=5, script_output=quiet, on_progress=seen.append)
        )
    assert outcome.report is not None and outcome.report.window_complete
    assert seen and seen == sorted(seen) and len(set(seen)) == len(seen)  # told as steps pass, each count once
    assert seen[-1] <= 2 + 5


def test_steps_written_just_before_the_child_ends_are_still_heard(tmp_path):
    """A short run can end between two looks at the progress file (CI saw `seen == []`): the runner
    reads it once more after the child has ended."""
    from loopaudit.profiling.in_loopaudit.runner import RunRequest, _Files, _Signals, _watch

    files = _Files(str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", f"open({files.progress!r}, 'w').write('7')"])
    seen: list[int] = []
    assert _watch(child, files, RunRequest(script="", on_progress=seen.append), _Signals()) is False
    assert child.wait() == 0 and seen == [7]
