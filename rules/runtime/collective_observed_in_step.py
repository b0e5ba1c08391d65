from __future__ import annotations

import os

from loopaudit.rule_api import Observation, RuntimeRule, Undecided


class CollectiveObservedInStep(RuntimeRule):
    code = "LA606"
    name = "collective-observed-in-step"
    summary = "A `torch.distributed` collective measured in most steps, with the time each rank waited in it."
    message = "this line ran a collective across all ranks in most measured steps"
    suggestion = (
        "keep logged values on each rank and reduce them under the logging interval (`if step % log_interval == 0:`) "
        "or once per epoch"
    )
    what_it_flags = (
        "A line of the user's code that, while `loopaudit run` measured the script, called one of "
        "`torch.distributed`'s collectives (`all_reduce`, `reduce`, `barrier`, `broadcast`, `all_gather`, "
        "`all_gather_object`, `gather`, `scatter`, `reduce_scatter`, `all_to_all`, and their kin) in more "
        "than half of the measured steps, directly or through a library (SyncBatchNorm's gathers are "
        "reported at the user's line with the library function named). The time is what the rank spent "
        "inside the call: the round trip plus the wait for the slowest rank. The user's lines above the "
        "call are kept too, so a helper's `all_reduce` confirms the scan's LA703 at the step's call of the "
        "helper. DDP's own gradient all-reduce runs from C++ inside `backward()` and is not counted."
    )
    why_it_costs = (
        "A blocking collective returns only when every rank has reached it: every step then waits for the "
        "slowest rank, and the round trip sits on the critical path. On CUDA the host also waits for the "
        "device before it can read the result."
    )
    example = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    dist.all_reduce(loss)  # LA606: 1 per step, 0.8 ms waited per step\n"
    )
    use_instead = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % log_interval == 0:\n"
        "        dist.all_reduce(loss)\n"
    )
    fix_safety = "No automatic fix: where a reduction can move depends on what the code logs (LA703 says the same)."
    valid = (
        # Reduced only at the logging interval.
        "import os, tempfile\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='file://' + os.path.join(tempfile.mkdtemp(), 'rdv'), rank=0, world_size=1)\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(60):\n"
        "    loss = model(torch.randn(32, 16)).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 20 == 0:\n"
        "        dist.all_reduce(loss.detach())\n",
    )
    invalid = (
        "import os, tempfile\n"
        "import torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='file://' + os.path.join(tempfile.mkdtemp(), 'rdv'), rank=0, world_size=1)\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(60):\n"
        "    loss = model(torch.randn(32, 16)).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    reported = loss.detach().clone()\n"
        "    dist.all_reduce(reported)  # expect: LA606\n"
        "    dist.barrier()  # expect: LA606\n",
    )

    def from_run(self, run):
        for site in run.report.collectives:
            verdict = run.step_path(site)
            what = f"`{site.call}`"
            if verdict == "inconclusive":
                yield Undecided(run.undecided_site(self.code, what, site))
            if verdict != "above":
                continue
            waited = site.seconds * 1000 / run.steps_measured
            via = f", through `{site.via}`" if site.via else ""
            yield Observation(
                file=site.file,
                line=site.line,
                message=f"{what} ran across all ranks {run.counted(site)}{via}, {waited:.2f} ms waited in it per step",
                observed={
                    "per_step": run.per_step(site.count),
                    "total": site.count,
                    "time_ms": round(site.seconds * 1000, 3),
                },
                details={
                    "call": site.call,
                    "via": site.via,
                    # the user's lines above the call (a helper's caller), where a static finding may sit
                    "also_at": [[os.path.abspath(file), line] for file, line in site.stack[1:]],
                },
            )
