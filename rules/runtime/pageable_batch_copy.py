from __future__ import annotations

from collections import defaultdict
from typing import ClassVar

from loopaudit.rule_api import Observation, RuntimeRule, Undecided


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"


class PageableBatchCopy(RuntimeRule):
    code = "LA603"
    name = "pageable-batch-copy"
    summary = "Batches copied to the GPU from pageable (unpinned) host memory in most measured steps."
    message = "this DataLoader's batches were copied to the GPU from pageable memory every step"
    suggestion = "`DataLoader(..., pin_memory=True)`, and copy with `.to(device, non_blocking=True)`"
    what_it_flags = (
        "A DataLoader whose batches the measured steps copied to the GPU from pageable (unpinned) host "
        "memory, in more than half of the steps (the whole 95% interval of that share above one half), "
        "reported at the line that created the loader (where the "
        "fix goes), with the lines that copy. On CUDA `loopaudit run` sees each `.to(...)`/`.cuda()` of a "
        "tensor the DataLoader handed out, and whether its memory was pinned. On a machine without a GPU it "
        "reads the loader's live `pin_memory` setting and reports a loader without it whose batches the "
        "script moves with `.to(device)` each step: the copies a CUDA run would make from pageable memory. "
        "There it also needs `loopaudit scan`'s LA201 on the same DataLoader, because a CPU run's settings "
        "are not a CUDA run's: many scripts pass `pin_memory=True` only when CUDA is available. "
        "From a trace, it is the `Memcpy HtoD (Pageable -> Device)` copies inside the steps."
    )
    why_it_costs = (
        "The GPU's copy engine can only read page-locked memory. From pageable memory, the CUDA driver "
        "first copies the data into a page-locked staging buffer on the CPU, synchronously, and only then "
        "to the GPU, so the copy cannot overlap with the host's work and `non_blocking=True` has no effect. "
        "With `pin_memory=True`, the DataLoader's pin thread puts each batch in page-locked memory ahead "
        "of time, and `.to(device, non_blocking=True)` becomes a real asynchronous copy."
    )
    example = (
        "loader = DataLoader(train_set, batch_size=256, num_workers=8)  # LA603\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
    )
    use_instead = (
        "loader = DataLoader(train_set, batch_size=256, num_workers=8, pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
    )
    fix_safety = (
        "No automatic fix here (`loopaudit scan`'s LA201 and LA202 point at the same lines). Pinning is "
        "safe for the results; it takes page-locked host memory for a few batches."
    )
    valid: ClassVar[tuple[str, ...]] = (
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
        "model = torch.nn.Linear(16, 4).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        "loader = DataLoader(data, batch_size=32, pin_memory=True)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    valid += (
        # Pinned only when CUDA is there, as pytorch/examples' MNIST script does: a CPU run's loader
        # is unpinned, a CUDA run's is not.
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "use_cuda = torch.cuda.is_available()\n"
        'device = torch.device("cuda" if use_cuda else "cpu")\n'
        "model = torch.nn.Linear(16, 4).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        'kwargs = {"batch_size": 32}\n'
        "if use_cuda:\n"
        '    kwargs.update({"num_workers": 1, "pin_memory": True})\n'
        "loader = DataLoader(data, **kwargs)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
        "model = torch.nn.Linear(16, 4).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        "loader = DataLoader(data, batch_size=32)  # expect: LA603\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )

    def from_run(self, run):
        moves_by_loader = defaultdict(list)
        for move in run.report.batch_moves:
            if run.step_path(move) != "below":
                moves_by_loader[move.loader].append(move)
        for index, candidates in sorted(moves_by_loader.items()):
            loader = run.report.loaders[index]
            if run.cuda:
                candidates = [move for move in candidates if move.pageable]
            elif loader.pin_memory or not run.scan_reported("LA201", loader.file, loader.line):
                # Without a GPU the live settings are not a CUDA run's: scripts often pin only
                # when CUDA is available (`if use_cuda: kwargs.update(pin_memory=True)`). The
                # scan's LA201 says the source never pins this loader.
                candidates = []
            moves = [move for move in candidates if run.on_step_path(move)]
            if not moves:
                for move in candidates:  # seen in about half of the steps: neither per-step nor periodic
                    yield Undecided(run.undecided_site(self.code, "a copy of this DataLoader's batch", move))
                continue
            count = sum(move.count for move in moves)
            size = sum(move.bytes for move in moves)
            lines = ", ".join(sorted({str(move.line) for move in moves}, key=int))
            per_step = run.per_step(count)
            if run.cuda:
                seconds = sum(move.seconds for move in moves)
                message = (
                    f"the steps copied this DataLoader's batches to the GPU from pageable memory {per_step:g} "
                    f"times per step (line {lines}; {_megabytes(size // run.steps_measured)} and "
                    f"{seconds * 1000 / run.steps_measured:.2f} ms per step): it runs with pin_memory=False"
                )
                time_ms = round(seconds * 1000, 3)
            else:
                message = (
                    f"the steps move this DataLoader's batches to the device {per_step:g} times per step "
                    f"(line {lines}; {_megabytes(size // run.steps_measured)} per step) and it runs with "
                    "pin_memory=False: on CUDA each copy would be staged through pageable memory, synchronously"
                )
                time_ms = None
            file, line = (loader.file, loader.line) if loader.file else (moves[0].file, moves[0].line)
            yield Observation(
                file=file,
                line=line,
                message=message,
                observed={"per_step": per_step, "total": count, "time_ms": time_ms, "bytes": size},
                details={"copies": [{"file": move.file, "line": move.line, "count": move.count} for move in moves]},
            )

    def from_trace(self, trace):
        steps = len(trace.steps) or 1
        for copy in trace.copies:
            if copy.kind != "HtoD pageable" or not trace.on_step_path(copy):
                continue
            under = f" under `{copy.operator}`" if copy.operator else ""
            yield Observation(
                file=copy.frame.file if copy.frame else trace.path,
                line=copy.frame.line if copy.frame else None,
                message=(
                    f"{copy.count} host-to-device copies from pageable memory{under} ({copy.count / steps:g} per "
                    f"step, {_megabytes(copy.bytes)}, {copy.duration_us / 1000:.2f} ms on the GPU in all)"
                ),
                observed={
                    "per_step": round(copy.count / steps, 3),
                    "total": copy.count,
                    "time_ms": round(copy.duration_us / 1000, 3),
                    "bytes": copy.bytes,
                },
            )
