"""`loopaudit run` on several ranks, for real: gloo on the CPU, two ranks started by loopaudit itself
(`--nproc-per-node 2`) or by torch's own launcher (`--launcher "torchrun ..."`), each measured by its
probe, then one merged report. The scripts are examples/ddp_train.py (a straggler, a failing rank, a
hung rank, a per-step all-reduce) and the LA702 fixture pair (accumulation with and without
`no_sync()`). Every test also checks that no process of the job is left behind."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from .conftest import SHARED_TRACES, run_cli

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("torch", reason="`loopaudit run` needs torch (pip install 'loopaudit[profile]')")


def _job_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (the copied script's unique folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                command = stream.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stream:
                state = stream.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in command and state != "Z":
            found.append(command)
    return found


@pytest.fixture
def job(tmp_path):
    """Copies of the scripts in a folder of their own, and a check that no process outlives the test."""
    for name in ("examples/ddp_train.py", "fixtures/distributed_accumulation_without_no_sync_bad.py"):
        shutil.copy(ROOT / name, tmp_path / Path(name).name)
    shutil.copy(
        ROOT / "fixtures/distributed_accumulation_without_no_sync_fixed.py",
        tmp_path / "distributed_accumulation_without_no_sync_fixed.py",
    )
    yield tmp_path
    assert _job_processes(str(tmp_path)) == [], "a process of the job outlived loopaudit"


def _run(job: Path, *args: str, may_fail: bool = False):
    return run_cli("run", "--output-format", "json", *args, cwd=job, script_may_fail=may_fail)


def _ranks(result) -> dict:
    document = json.loads(result.out)
    return document, {rank["rank"]: rank for rank in document["ranks"]}


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to check that no process is left")
class TestTwoRanks:
    def test_a_rank_with_a_slow_loader_is_named_the_straggler(self, job):
        result = _run(job, "--nproc-per-node", "2", "ddp_train.py", "--", "--slow-rank", "1")
        document, ranks = _ranks(result)
        assert document["world_size"] == 2
        assert [ranks[r]["status"] for r in (0, 1)] == ["measured", "measured"]
        assert all(ranks[r]["steps_measured"] == 20 for r in (0, 1))
        assert document["straggler"]["rank"] == 1
        assert "DataLoader" in document["straggler"]["reason"]
        # the slow rank's loader is reported, and only that rank's
        waits = [f for f in document["findings"] if f["code"] == "LA602"]
        assert waits and all(f["details"]["ranks"] == [1] for f in waits)

    def test_balanced_ranks_name_no_straggler(self, job):
        result = _run(job, "--nproc-per-node", "2", "ddp_train.py")
        document, _ = _ranks(result)
        assert result.returncode == 0, result.err
        assert document["straggler"]["rank"] is None

    def test_a_rank_that_raises_is_reported_first_and_its_status_kept(self, job):
        result = _run(job, "--nproc-per-node", "2", "ddp_train.py", "--", "--fail-rank", "1", may_fail=True)
        _document, ranks = _ranks(result)
        assert result.returncode == 1
        assert ranks[1]["status"] == "failed first (exit 1)"
        assert ranks[0]["status"].startswith("failed after rank 1")
        assert "rank 1 failed first" in result.err
        assert "RuntimeError: rank 1 failed at step 8" in result.err  # the script's own traceback

    def test_a_hung_rank_is_named_with_its_line_and_the_job_fails(self, job):
        result = _run(
            job,
            "--nproc-per-node",
            "2",
            "--timeout",
            "15",
            "ddp_train.py",
            "--",
            "--hang-rank",
            "1",
            "--fail-step",
            "12",
        )
        document, _ = _ranks(result)
        assert result.returncode == 2
        assert document["straggler"]["rank"] == 1
        assert "ddp_train.py:" in document["straggler"]["reason"]
        assert "the job hung: rank 1" in result.err

    def test_a_per_step_all_reduce_is_measured_and_confirms_the_scan(self, job):
        result = _run(job, "--nproc-per-node", "2", "ddp_train.py", "--", "--log-every-step")
        document, ranks = _ranks(result)
        assert result.returncode == 1
        assert all(ranks[r]["collectives_per_step"] == 1 for r in (0, 1))
        [collective] = document["collectives"]
        assert collective["call"] == "torch.distributed.all_reduce"
        assert collective["per_step"] == {"0": 1.0, "1": 1.0}
        [static] = [check for check in document["static"] if check["code"] == "LA703"]
        assert static["confirmed"] and static["measurement"]["code"] == "LA606"

    def test_accumulation_without_no_sync_is_measured_and_its_fix_is_clean(self, job):
        bad = _run(job, "--nproc-per-node", "2", "distributed_accumulation_without_no_sync_bad.py")
        document, _ = _ranks(bad)
        [finding] = [f for f in document["findings"] if f["code"] == "LA607"]
        assert finding["details"]["reductions_per_step"] == 4
        [static] = [check for check in document["static"] if check["code"] == "LA702"]
        assert static["confirmed"]
        fixed = _run(job, "--nproc-per-node", "2", "distributed_accumulation_without_no_sync_fixed.py")
        document, _ = _ranks(fixed)
        assert fixed.returncode == 0, fixed.out
        assert not [f for f in document["findings"] if f["code"] == "LA607"]

    def test_under_torchs_own_launcher(self, job):
        torchrun = Path(sys.executable).with_name("torchrun")
        launcher = f"{torchrun} --standalone --nproc-per-node 2"
        result = _run(job, "--launcher", launcher, "ddp_train.py", "--", "--slow-rank", "0")
        document, ranks = _ranks(result)
        assert sorted(ranks) == [0, 1]
        assert document["straggler"]["rank"] == 0


def test_profile_and_several_ranks_are_refused(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n")
    result = run_cli("run", "--nproc-per-node", "2", "--profile", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "--profile records one process" in result.err
    result = run_cli("run", "--nproc-per-node", "2", "--launcher", "torchrun", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "give one of them" in result.err
    result = run_cli("run", "--launcher", "no-such-launcher-x", "train.py", cwd=tmp_path)
    assert result.returncode == 2 and "cannot start the launcher" in result.err


TRACED = """\
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if rank == 1:
            time.sleep(0.004)  # rank 1's storage is slow
        return torch.randn(32), i % 4


def save(prof):
    prof.export_chrome_trace(os.path.join(sys.argv[1], f"rank-{rank}.json"))


model = DistributedDataParallel(torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Slow(), batch_size=8)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=10), on_trace_ready=save) as prof:
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        prof.step()
        if step == 12:
            break
dist.destroy_process_group()
"""


def test_analyze_reads_a_folder_of_per_rank_traces_and_names_the_straggler(tmp_path):
    """Traces recorded by each rank of a real gloo DDP job under torchrun (rank 1's dataset is slow):
    the ranks side by side, the others' time in DDP's all-reduce as comm wait, rank 1 the straggler."""
    import subprocess

    (tmp_path / "traced.py").write_text(TRACED)
    traces = tmp_path / "traces"
    traces.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "traced.py", str(traces)],
        cwd=tmp_path,
        capture_output=True,
        check=True,
        timeout=300,
    )
    result = run_cli("analyze", str(traces), "--output-format", "json")
    document = json.loads(result.out)
    ranks = {rank["rank"]: rank for rank in document["ranks"]}
    assert sorted(ranks) == [0, 1] and all(ranks[r]["steps"] == 10 for r in (0, 1))
    assert document["straggler"]["rank"] == 1
    # rank 0 waits for rank 1 inside DDP's gloo all-reduce
    assert ranks[0]["comm_wait_ms"]["value"] > 5 * ranks[1]["comm_wait_ms"]["value"]
    [wait] = [f for f in document["findings"] if f["code"] == "LA602"]
    assert wait["details"]["ranks"] == [1]


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=f"the real traces are not here ({SHARED_TRACES})")
def test_analyze_folder_names_ranks_by_file_and_refuses_two_of_one_rank(tmp_path):
    shared_traces = SHARED_TRACES
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(shared_traces / "local-cpu-torch2.13/cpu_nw0_slowds_stack.json.gz", folder / "rank-0.json.gz")
    shutil.copy(shared_traces / "local-cpu-torch2.13/cpu_nw4_slowds_stack.json.gz", folder / "rank-1.json.gz")
    result = run_cli("analyze", str(folder), "--output-format", "json")
    document = json.loads(result.out)
    assert [rank["rank"] for rank in document["ranks"]] == [0, 1]
    assert "fewer than 6 steps" in document["straggler"]["reason"]  # 3 profiled steps each
    shutil.copy(folder / "rank-1.json.gz", folder / "trace_rank1.json.gz")
    result = run_cli("analyze", str(folder))
    assert result.returncode == 2 and "are both rank 1" in result.err
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("analyze", str(empty))
    assert result.returncode == 2 and "holds no trace" in result.err
