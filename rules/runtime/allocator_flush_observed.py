from __future__ import annotations

from loopaudit.rule_api import Observation, RuntimeRule, Undecided


class AllocatorFlushObserved(RuntimeRule):
    code = "LA604"
    name = "allocator-flush-observed"
    summary = "`torch.cuda.empty_cache()` measured in most steps: the caching allocator is flushed every step."
    message = "`torch.cuda.empty_cache()` ran in most measured steps"
    suggestion = (
        "remove it from the step; if fragmentation causes OOMs set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
    )
    what_it_flags = (
        "A line that called `torch.cuda.empty_cache()` in more than half of the measured steps (the whole "
        "95% interval of that share above one half; about half is said to be undecided). "
        "`loopaudit run` counts every call through the function itself (however the script imported it), "
        "with the user's line and, on CUDA, the time spent inside it; on a machine without a GPU the call "
        "does nothing, but it is counted all the same, since on CUDA it would flush the cache. From a "
        "trace, it is `cudaFree` calls (the caching allocator handing memory back to the driver) in more "
        "than half of the steps."
    )
    why_it_costs = (
        "PyTorch's caching allocator keeps freed GPU memory to serve the next step's tensors without "
        "asking the driver. `empty_cache()` hands every unused cached block back with `cudaFree`, which "
        "synchronizes the device; the next step then finds the cache empty and calls `cudaMalloc` again "
        "for its activations and gradients, another slow, synchronizing driver call each time."
    )
    example = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    torch.cuda.empty_cache()  # LA604: 1 per step, 4.1 ms per step\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
    )
    fix_safety = "No automatic fix; removing the call does not change results (`loopaudit scan`'s LA401 says the same)."
    valid = (
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        "for step, (x, y) in enumerate(DataLoader(data, batch_size=32)):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 50 == 0:\n"
        "        torch.cuda.empty_cache()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.cuda import empty_cache\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        "for x, y in DataLoader(data, batch_size=32):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    empty_cache()  # expect: LA604\n",
    )

    def from_run(self, run):
        for site in run.report.empty_cache:
            verdict = run.step_path(site)
            if verdict == "inconclusive":
                yield Undecided(run.undecided_site(self.code, "`torch.cuda.empty_cache()`", site))
            if verdict != "above":
                continue
            counted = run.counted(site)
            if run.cuda:
                message = (
                    f"`torch.cuda.empty_cache()` flushed the caching allocator {counted}, "
                    f"{site.seconds * 1000 / run.steps_measured:.2f} ms per step inside the call"
                )
            else:
                message = (
                    f"`torch.cuda.empty_cache()` ran {counted}: on CUDA it flushes the caching allocator each time"
                )
            yield Observation(
                file=site.file,
                line=site.line,
                message=message,
                observed=run.observed(site),
            )

    def from_trace(self, trace):
        # A trace without step marks cannot say whether frees happen every step or once.
        if not trace.marks_steps or trace.steps_freeing * 2 <= len(trace.steps):
            return
        frees = sum(count for name, count in trace.allocator_calls.items() if name in ("cudaFree", "hipFree"))
        frame = trace.free_frame
        yield Observation(
            file=frame.file if frame else trace.path,
            line=frame.line if frame else None,
            message=(
                f"the caching allocator handed memory back to the driver (`cudaFree`) in {trace.steps_freeing} of "
                f"{len(trace.steps)} steps ({frees} calls): something flushes the cache each step, as "
                "`torch.cuda.empty_cache()` does"
            ),
            observed={
                "per_step": round(frees / len(trace.steps), 3),
                "total": frees,
                "time_ms": round(trace.allocator_us / 1000, 3),
            },
        )
