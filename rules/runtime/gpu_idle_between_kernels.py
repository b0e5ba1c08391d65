from __future__ import annotations

from loopaudit.rule_api import Observation, RuntimeRule

# Above this share of the measured window with no kernel, copy or memset running, the GPU waits for
# the host. A well-fed training loop keeps it under a tenth; the real traces in the test suite that
# show a data-loader stall (39%) or per-step blocking copies (24%) are both above it.
THRESHOLD = 0.20


def _trace_document(kernels: list[tuple[int, int]], steps: int, step_us: int) -> str:
    """A kineto trace with `steps` ProfilerSteps and one launched kernel per (start, duration)."""
    events = [
        f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{n}", "pid": 1, "tid": 1, '
        f'"ts": {n * step_us}, "dur": {step_us}}}'
        for n in range(steps)
    ]
    for correlation, (start, duration) in enumerate(kernels, 1):
        events.append(
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
            f'"ts": {start - 10}, "dur": 5, "args": {{"correlation": {correlation}}}}}'
        )
        events.append(
            f'{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7, '
            f'"ts": {start}, "dur": {duration}, "args": {{"correlation": {correlation}}}}}'
        )
    return '{"traceEvents": [\n  ' + ",\n  ".join(events) + '\n], "deviceProperties": [{"name": "NVIDIA H100"}]}\n'


class GpuIdleBetweenKernels(RuntimeRule):
    code = "LA605"
    name = "gpu-idle-between-kernels"
    summary = "The GPU sat idle for more than 20% of the measured window (needs a CUDA trace)."
    message = "the GPU was idle for more than 20% of the measured window"
    suggestion = (
        "find what the host waits for: data (LA602), syncs (LA601), or kernel launches (CUDA graphs, torch.compile)"
    )
    what_it_flags = (
        "A profiled window in which the GPU ran nothing (no kernel, copy or memset) for more than 20% of "
        "the time between its first and last activity, computed as HolisticTraceAnalysis computes GPU "
        "idle time (over the steps before the last, which the trace may cut short). It needs a CUDA "
        "trace: `loopaudit run --profile` on a GPU machine, or `loopaudit analyze` on a trace someone "
        "recorded. The message says where the host's time went, from the same measurement: waiting for "
        "data, synchronizing, or launching kernels."
    )
    why_it_costs = (
        "Every idle gap on the GPU is paid in wall time: the job runs as fast as its GPU is kept busy. "
        "The GPU idles when the host has not queued the next work yet, because the host waits for a "
        "batch, because a sync drained the queue, or because launching many small kernels from Python "
        "takes longer than running them."
    )
    example = (
        "# A small model, many small kernels, a sync per step:\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    print(loss.item())  # LA605: GPU idle 64% of the window\n"
    )
    use_instead = (
        'model = torch.compile(model, mode="reduce-overhead")  # fewer, larger launches (CUDA graphs)\n'
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    if step % 100 == 0:\n"
        "        print(loss.item())\n"
    )
    fix_safety = "No automatic fix: the cure depends on what the host was doing, which the message names."
    # A GPU is needed to see it in a running script; the script examples run only where there is one.
    valid = (
        "import torch\n"
        'model = torch.nn.Linear(4096, 4096, device="cuda")\n'
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        'x = torch.randn(8192, 4096, device="cuda")\n'
        "for step in range(1000):\n"
        "    loss = model(x).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import time\n"
        "import torch\n"
        'model = torch.nn.Linear(64, 64, device="cuda")\n'
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(1000):\n"
        '    x = torch.randn(32, 64, device="cuda")\n'
        "    time.sleep(0.002)  # host work between steps\n"
        "    loss = model(x).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()  # expect: LA605\n",
    )
    requires_cuda = True
    needs_trace = True
    # Traces that `loopaudit analyze` reads on any machine: kernels back to back, then kernels
    # 100 microseconds long in steps of 1000.
    valid_traces = (_trace_document([(50, 1000), (1050, 1000), (2050, 900)], steps=3, step_us=1000),)
    invalid_traces = (_trace_document([(100, 100), (1100, 100), (2100, 100)], steps=3, step_us=1000),)

    def from_run(self, run):
        trace = run.trace
        if trace is None or trace.gpu_idle_fraction is None or trace.gpu_idle_fraction <= THRESHOLD:
            return
        file, line = run.location_of_step()
        waiting = run.data_wait_fraction or 0.0
        stalled = sum(step.sync_seconds for step in run.report.steps) / run.step_seconds if run.step_seconds else 0.0
        if waiting > 0.05 and waiting >= stalled:
            cause = f"the steps waited {waiting:.0%} of their time for batches (see LA602)"
        elif stalled > 0.05:
            cause = f"the steps spent {stalled:.0%} of their time in syncs (see LA601)"
        else:
            cause = (
                "the host did not queue work fast enough: launch fewer, larger kernels "
                '(`torch.compile(mode="reduce-overhead")`, CUDA graphs, a larger batch)'
            )
        yield self._observation(trace, file, line, cause)

    def from_trace(self, trace):
        if trace.gpu_idle_fraction is None or trace.gpu_idle_fraction <= THRESHOLD:
            return
        yield self._observation(trace, trace.path, None, None)

    @staticmethod
    def _observation(trace, file: str, line: int | None, cause: str | None) -> Observation:
        idle = trace.gpu_idle_fraction
        return Observation(
            file=file,
            line=line,
            message=f"the GPU ran nothing for {idle:.1%} of the measured window" + (f": {cause}" if cause else ""),
            observed={
                "per_step": None,
                "total": None,
                "time_ms": round(trace.gpu_idle_us / 1000, 3),
                "share": round(idle, 4),
            },
        )
