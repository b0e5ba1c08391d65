from __future__ import annotations

import statistics

from loopaudit.rule_api import Observation, RuntimeRule, Undecided, steps_phrase

_SETUP = (
    "import contextlib, os, tempfile\n"
    "import torch\n"
    "import torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel\n"
    "dist.init_process_group('gloo', init_method='file://' + os.path.join(tempfile.mkdtemp(), 'rdv'), rank=0, world_size=1)\n"
    "model = DistributedDataParallel(torch.nn.Linear(16, 4))\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)


class DdpSyncPerMicroBatch(RuntimeRule):
    code = "LA607"
    name = "ddp-sync-per-micro-batch"
    summary = "DDP measured all-reducing the gradients after every micro-batch of an accumulated step."
    message = "DDP all-reduced the gradients after every micro-batch's backward, several times per optimizer step"
    suggestion = "run the forward and backward of every micro-batch but the last inside `with model.no_sync():`"
    what_it_flags = (
        "While `loopaudit run` measured the script, optimizer steps in which DDP armed its gradient all-reduce "
        "more than once: a `DistributedDataParallel` forward ran with autograd on and gradient sync enabled "
        "(not inside `no_sync()`) several times before one `optimizer.step()`. Reported, in most measured steps, "
        "at each line whose backward then ran the all-reduce: where the scan's LA702 points."
    )
    why_it_costs = (
        "Each armed backward all-reduces every gradient bucket of the model: k micro-batches pay k reductions "
        "of the whole model's gradients where the optimizer needs one."
    )
    example = (
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y) / 4\n"
        "    loss.backward()  # LA607: 4 gradient all-reduces per optimizer step\n"
        "    if (i + 1) % 4 == 0:\n"
        "        optimizer.step()\n"
    )
    use_instead = (
        "for i, (x, y) in enumerate(loader):\n"
        "    boundary = (i + 1) % 4 == 0\n"
        "    with contextlib.nullcontext() if boundary else model.no_sync():\n"
        "        loss = criterion(model(x), y) / 4\n"
        "        loss.backward()\n"
        "    if boundary:\n"
        "        optimizer.step()\n"
    )
    fix_safety = "No automatic fix (LA702 says why)."
    valid = (
        _SETUP + "for i in range(120):\n"
        "    boundary = (i + 1) % 4 == 0\n"
        "    with contextlib.nullcontext() if boundary else model.no_sync():\n"
        "        loss = model(torch.randn(32, 16)).square().mean() / 4\n"
        "        loss.backward()\n"
        "    if boundary:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n",
    )
    invalid = (
        _SETUP + "for i in range(120):\n"
        "    loss = model(torch.randn(32, 16)).square().mean() / 4\n"
        "    loss.backward()  # expect: LA607\n"
        "    if (i + 1) % 4 == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n",
    )

    def from_run(self, run):
        steps = run.report.steps
        if not run.report.ddp_syncs or not steps:
            return
        several = sum(1 for step in steps if step.ddp_syncs > 1)
        typical = statistics.median(step.ddp_syncs for step in steps)
        verdict = run.in_most_steps(several)
        if verdict == "inconclusive":
            yield Undecided(
                f"{self.code} undecided: DDP armed more than one gradient all-reduce in {several} of "
                f"{steps_phrase(len(steps), 'measured')}; measure more steps to settle it"
            )
        if verdict != "above":
            return
        for site in run.report.ddp_syncs:
            yield Observation(
                file=site.file,
                line=site.line,
                message=(
                    f"DDP all-reduced the gradients after this backward {run.counted(site)}: "
                    f"{typical:g} gradient all-reduces per optimizer step (in {several} of "
                    f"{steps_phrase(len(steps), 'measured')}), where one would do"
                ),
                observed={"per_step": run.per_step(site.count), "total": site.count, "time_ms": None},
                details={"reductions_per_step": typical},
            )
