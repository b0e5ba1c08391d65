from __future__ import annotations

from loopaudit.rule_api import Observation, RuntimeRule, Undecided, steps_phrase

# What to write instead, by the kind of call that synchronized.
_ADVICE = {
    "item": "keep the value on the GPU (`total += loss.detach()`) and read it every N steps, under `if step % log_every == 0:`",
    "tolist": "keep the values on the GPU and read them every N steps or once per epoch",
    "float": "keep the value on the GPU (`total += loss.detach()`) and convert it every N steps",
    "int": "keep the value on the GPU and convert it every N steps",
    "format": "log every N steps, or log the tensor through a logger that keeps it on the GPU",
    "bool": "decide on the GPU (`torch.where`, `torch.clamp`, a mask) or check every N steps",
    "index": "index with the tensor itself, or keep the index a Python int",
    "boolean-mask index": "keep shapes static: `torch.where(mask, x, 0)` or `x * mask`, then reduce",
    "nonzero": "keep shapes static (`torch.where(mask, x, 0)`), or `nonzero_static(size=...)` with a bound",
    "argwhere": "keep shapes static (`torch.where(mask, x, 0)`), or `nonzero_static(size=...)` with a bound",
    "masked_select": "keep shapes static: `torch.where(mask, x, 0)` or `x * mask`, then reduce",
    "unique": "compute the set of values once, outside the loop, or use a fixed-size one-hot count",
    "unique_consecutive": "compute it once, outside the loop",
    "bincount": "count into a fixed-size tensor: `torch.zeros(n, device=d).scatter_add_(0, idx, ones)`",
    "repeat_interleave": "pass `output_size=` so the result's size need not be read back",
    "one_hot": "pass `num_classes=` so the number of classes need not be read back",
    "device-to-host copy": "keep results on the GPU and copy them once per epoch, or `.to('cpu', non_blocking=True)`",
    "blocking host-to-device copy": "pin the source (`DataLoader(..., pin_memory=True)`) and copy with `non_blocking=True`",
    "synchronize": "remove it from the step; to time steps, record CUDA events and read them every N steps",
    "cuda sync": "run with `--profile` and open the trace to see which operator synchronized",
}


class SyncObservedInStep(RuntimeRule):
    code = "LA601"
    name = "sync-observed-in-step"
    summary = "A call measured to synchronize the host with the GPU (or that would, on CUDA) in most steps."
    message = "this line synchronized the host with the GPU in most measured steps"
    suggestion = "keep values on the GPU and read them every N steps; keep shapes static; copy with `non_blocking=True`"
    what_it_flags = (
        "A line of the user's code that, while `loopaudit run` measured the script, made the host wait for "
        "the GPU in more than half of the measured steps: `.item()`, `.tolist()`, `float(t)`, `if t:`, "
        "printing a tensor, `nonzero`/`masked_select`/`unique`/`x[mask]` and other ops whose output size "
        "depends on values, device-to-host copies, blocking host-to-device copies and explicit "
        "`synchronize()` calls. On CUDA the call counts when its tensor is on the GPU, and torch's own sync "
        "check (`torch.cuda.set_sync_debug_mode`) also reports syncs made inside C++ code; library code that "
        "syncs on the user's behalf (GradScaler's `found_inf` read) is reported at the user's line with the "
        "library function named. On a machine without a GPU the same calls are reported as ones that would "
        "synchronize on CUDA, counting only calls the user's own code makes (the optimizer's `.item()` on its "
        "CPU step counter is not one). From a profiler trace (`loopaudit analyze`), a sync is a synchronizing "
        "runtime call (`cudaStreamSynchronize` and kin) inside a step, reported with the operator and the "
        "Python frame above it. Syncs in fewer than half of the steps (interval logging) are listed, not "
        "reported; one in about half of the steps (the 95% interval of its share holds one half) is said "
        "to be undecided, without a finding."
    )
    why_it_costs = (
        "CUDA runs asynchronously: the host queues kernels and moves on, and the GPU stays busy as long as "
        "the queue is ahead of it. A sync makes the host wait until the GPU has finished everything queued, "
        "so the queue drains to nothing, and after the sync the GPU idles while the host launches the next "
        "kernels. Once per step, that idle gap is paid on every step; on small or launch-bound models it is "
        "often the largest cost of the step. The stall time `loopaudit run` shows on CUDA is the time the host "
        "spent inside the call."
    )
    example = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.item()  # LA601: 1 per step, 2.9 ms stalled per step\n"
    )
    use_instead = (
        'running_loss = torch.zeros((), device="cuda")\n'
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.detach()\n"
        "    if step % 100 == 0:\n"
        "        print(running_loss.item() / (step + 1))  # one sync every 100 steps\n"
    )
    fix_safety = (
        "No automatic fix: moving a read to every N steps changes what is logged, and replacing a "
        "data-dependent shape changes the code's structure. The matching static rules (LA101-LA106) say "
        "the same per call."
    )
    valid = (
        # Interval logging and a plain Adam loop: the optimizer's own CPU step counter is no sync.
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.Adam(model.parameters())\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        "for step, (x, y) in enumerate(DataLoader(data, batch_size=32)):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 10 == 0:\n"
        '        print(f"step {step}: loss {loss.item():.3f}")\n',
        # A Dataset reading its own CPU tensors while the loader fetches a batch: data that never
        # was on the GPU cannot wait for it.
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Lengths(Dataset):\n"
        "    def __init__(self):\n"
        "        self.x, self.n = torch.randn(2048, 16), torch.randint(1, 16, (2048,))\n"
        "    def __len__(self):\n"
        "        return len(self.x)\n"
        "    def __getitem__(self, i):\n"
        "        n = self.n[i].item()\n"
        "        return self.x[i, :n].sum(), n % 4\n"
        "model = torch.nn.Linear(1, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(Lengths(), batch_size=32):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x.unsqueeze(1)), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # On a GPU the syncs are real; on the CPU each is reported as one that would be there.
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "cuda = torch.cuda.is_available()\n"
        'device = "cuda" if cuda else "cpu"\n'
        "model = torch.nn.Linear(16, 4).to(device)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,)))\n"
        'best = float("inf")\n'
        "for x, y in DataLoader(data, batch_size=32, pin_memory=cuda):\n"
        "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # pinned: no sync\n"
        "    out = model(x)\n"
        "    loss = torch.nn.functional.cross_entropy(out, y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    total = loss.item()  # expect: LA601\n"
        "    wrong = torch.nonzero(out.argmax(1) != y)  # expect: LA601\n"
        "    right = out[out.argmax(1) == y]  # expect: LA601\n"
        "    rows = out[:, 0]  # plain indexing: no sync\n"
        "    if loss < best:  # expect: LA601\n"
        "        best = loss.detach()\n"
        "    print(loss)  # expect: LA601\n",
    )

    def from_run(self, run):
        # Imported here: every scan loads this rule's class, and the evidence module (with the trace
        # analysis it needs) would cost each of them 30 ms.
        from loopaudit.rule_api import describe_site

        for site in run.report.syncs:
            verdict = run.step_path(site)
            what = describe_site(site.kind, site.call)
            if verdict == "inconclusive":
                yield Undecided(run.undecided_site(self.code, what, site))
            if verdict != "above":
                continue
            counted = run.counted(site)
            via = f", through `{site.via}`" if site.via else ""
            if run.cuda:
                stall = site.seconds * 1000 / run.steps_measured
                message = f"{what} synchronized the host with the GPU {counted}{via}, stalling {stall:.2f} ms per step"
            else:
                message = f"{what} would synchronize the host with the GPU on CUDA: {counted}{via}"
            yield Observation(
                file=site.file,
                line=site.line,
                message=message,
                observed=run.observed(site),
                suggestion=_ADVICE.get(site.kind),
                details={
                    "kind": site.kind,
                    "call": site.call,
                    "via": site.via,
                    "proven": bool(site.proven) if run.cuda else None,
                },
            )

    def from_trace(self, trace):
        steps = len(trace.steps) or 1
        for site in trace.syncs:
            if not trace.on_step_path(site):
                continue
            under = f" under `{site.operator}`" if site.operator and site.operator != site.call else ""
            counted = f"{site.count / steps:g} per step ({site.count} in {steps_phrase(steps)})"
            if site.proven:
                message = f"`{site.call}`{under} made the host wait for the GPU {counted}, {site.stall_us / 1000:.2f} ms in all"
            else:
                message = f"`{site.call}`{under} would synchronize the host with the GPU on CUDA: {counted}"
            yield Observation(
                file=site.frame.file if site.frame else trace.path,
                line=site.frame.line if site.frame else None,
                message=message,
                observed={
                    "per_step": round(site.count / steps, 3),
                    "total": site.count,
                    "time_ms": round(site.stall_us / 1000, 3) if site.proven else None,
                },
                details={
                    "call": site.call,
                    "operator": site.operator,
                    "function": site.frame.function if site.frame else None,
                },
            )
