from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext

_SYNCHRONIZE_FUNCTIONS = frozenset(
    {"torch.cuda.synchronize", "torch.accelerator.synchronize", "torch.cuda.current_stream"}
)


class ExplicitSynchronizeInStep(Rule):
    code = "LA106"
    name = "explicit-synchronize-in-step"
    summary = "`torch.cuda.synchronize()`, `stream.synchronize()` or `event.synchronize()` once per step."
    message = "`synchronize()` blocks the CPU until the GPU has finished all queued work, once per step"
    suggestion = (
        "remove it from the step; to time steps, record CUDA events (`start.record()`, `end.record()`) and "
        "read `start.elapsed_time(end)` at the log interval, or use `loopaudit run --profile`"
    )
    what_it_flags = (
        "An explicit host-device synchronization in code that runs once per step of a CUDA script: "
        "`torch.cuda.synchronize()` (however `torch` was imported), `torch.accelerator.synchronize()`, and "
        "`.synchronize()` on a stream or event (`torch.cuda.current_stream().synchronize()`, "
        "`end_event.synchronize()`). Device-side waits (`stream.wait_event`, `event.wait`) are not syncs "
        "with the host and are not flagged."
    )
    why_it_costs = (
        "The CPU stops until the GPU has run every kernel queued so far (`cudaDeviceSynchronize` or "
        "`cudaStreamSynchronize` in a profile), so the next step's kernels cannot be queued while the "
        "current ones run. Usually left over from timing code, where it makes the step slower than the "
        "thing being timed."
    )
    example = (
        "for x, y in loader:\n"
        "    t0 = time.time()\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    torch.cuda.synchronize()\n"
        "    step_times.append(time.time() - t0)\n"
    )
    use_instead = (
        "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    start.record()\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    end.record()\n"
        "    if step % log_interval == 0:\n"
        "        end.synchronize()\n"
        "        print(start.elapsed_time(end), 'ms')\n"
    )
    fix_safety = "No automatic fix: a synchronize can guard host code that reads device results."
    valid = (
        # Once, after training (e.g. before reading a timer).
        "import torch\n"
        "for x, y in loader:\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "torch.cuda.synchronize()\n",
        # Device-side waits are not host syncs.
        "import torch\n"
        "side = torch.cuda.Stream()\n"
        "for x, y in loader:\n"
        "    torch.cuda.current_stream().wait_stream(side)\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import time\n"
        "import torch as T\n"
        "from torch.cuda import synchronize\n"
        "for step in range(max_steps):\n"
        "    x, y = get_batch('train')\n"
        "    loss = model(x, y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    T.cuda.synchronize()  # expect: LA106\n"
        "    synchronize()  # expect: LA106\n"
        "    T.cuda.current_stream().synchronize()  # expect: LA106\n"
        "    done_event.synchronize()  # expect: LA106\n",
    )

    confirmed_by = ("LA601",)
    confirmable_on_cpu = False  # torch.cuda.synchronize() raises without CUDA
    node_types = (cst.Call,)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        qualified = ctx.qualified_name(node.func) or ""
        if qualified in ("torch.cuda.synchronize", "torch.accelerator.synchronize"):
            yield Report(
                node, f"`{qualified}()` blocks the CPU until the GPU has finished all queued work, once per step"
            )
        elif ctx.method_call(node, "synchronize") is not None and not node.args:
            yield Report(
                node, f"`{ctx.source(node)}` blocks the CPU until the GPU has finished the queued work, once per step"
            )
