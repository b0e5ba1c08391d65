"""The LA7xx rules across the modules of a project: DDP built in one module and the accumulation loop
in another, a communication helper defined in a utils module and called by the engine, the epoch set
in the entry script for a sampler made in a data factory; and the reverse: an unrelated script of the
same repository that wraps its own model in DDP changes nothing for the others."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import run_cli

MAIN = """\
import argparse
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from engine import train_one_epoch
from data import make_loader

parser = argparse.ArgumentParser()
parser.add_argument("--accum-iter", type=int, default={accum})
args = parser.parse_args()
model = DDP(torch.nn.Linear(8, 2).cuda(), device_ids=[0])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader, sampler = make_loader(args)
for epoch in range(10):
{set_epoch}    train_one_epoch(model, loader, optimizer, args.accum_iter)
"""

ENGINE = """\
import torch
from utils import reduce_dict

def train_one_epoch(model, loader, optimizer, accum_iter):
    for i, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        losses = {"ce": torch.nn.functional.cross_entropy(model(x), y)}
        loss = sum(losses.values()) / accum_iter
        loss.backward()
        if (i + 1) % accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
        logged = reduce_dict(losses)
"""

UTILS = """\
import torch
import torch.distributed as dist

def reduce_dict(values):
    stacked = torch.stack(list(values.values()))
    dist.all_reduce(stacked)
    return dict(zip(values, stacked / dist.get_world_size()))
"""

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

def make_loader(args):
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    return DataLoader(data, batch_size=8, sampler=sampler, num_workers=2, pin_memory=True, persistent_workers=True), sampler
"""


def _project(root: Path, accum: int = 4, set_epoch: bool = False) -> Path:
    root.mkdir()
    (root / "main.py").write_text(
        MAIN.format(accum=accum, set_epoch="    sampler.set_epoch(epoch)\n" if set_epoch else "")
    )
    (root / "engine.py").write_text(ENGINE)
    (root / "utils.py").write_text(UTILS)
    (root / "data.py").write_text(DATA)
    return root


def _found(root: Path) -> set[tuple[str, int, str]]:
    result = run_cli("scan", str(root), "--select", "LA7", "--output-format", "json", "--isolated", "--no-cache")
    assert result.returncode in (0, 1), result.err
    return {(Path(f["filename"]).name, f["location"]["row"], f["code"]) for f in json.loads(result.out)}


def test_each_problem_is_found_in_the_module_where_it_lives(tmp_path):
    found = _found(_project(tmp_path / "job"))
    assert found == {
        ("engine.py", 9, "LA702"),  # DDP built in main.py
        ("engine.py", 13, "LA703"),  # the all_reduce is in utils.py; the step calls it here
        ("data.py", 7, "LA705"),  # no module calls set_epoch
    }


def test_the_fixed_project_is_clean(tmp_path):
    # one micro-batch per step by default (the option's declared default), the epoch given
    root = _project(tmp_path / "job", accum=1, set_epoch=True)
    (root / "engine.py").write_text(ENGINE.replace("        logged = reduce_dict(losses)\n", ""))
    assert _found(root) == set()


def test_an_unrelated_ddp_script_of_the_repository_changes_nothing(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "single_gpu.py").write_text(
        "import torch\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x.cuda()).sum() / 4\n"
        "    loss.backward()\n"
        "    if (i + 1) % 4 == 0:\n"
        "        optimizer.step()\n"
    )
    (root / "other_ddp.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel\nmodel = DistributedDataParallel(net)\n"
    )
    assert _found(root) == set()
