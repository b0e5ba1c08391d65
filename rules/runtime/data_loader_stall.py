from __future__ import annotations

from loopaudit.rule_api import Observation, RuntimeRule, Undecided, steps_phrase

# TensorBoard's profiler plugin recommends more DataLoader workers above this share of the step.
THRESHOLD = 0.05


def settings(loader) -> str:
    return (
        f"num_workers={loader.num_workers}, pin_memory={loader.pin_memory}, "
        f"persistent_workers={loader.persistent_workers}, prefetch_factor={loader.prefetch_factor}"
    )


def advice(loader, cpu_count: int) -> str:
    """What to change, from how the loader really runs and where its wait went."""
    workers = loader.num_workers
    if workers == 0:
        suggested = max(2, min(8, cpu_count - 1))
        return (
            f"load batches in worker processes: `DataLoader(..., num_workers={suggested}, persistent_workers=True)` "
            f"(this machine has {cpu_count} CPUs); the main process then only trains"
        )
    if loader.first_batch_wait_seconds > 0.5 * loader.starved_seconds and not loader.persistent_workers:
        return (
            "most of the wait is the workers starting again for each new iterator (each epoch): "
            "`persistent_workers=True` keeps them alive"
        )
    if workers >= cpu_count:
        return (
            f"the {workers} workers already use every CPU: make each sample cheaper to load (decode or augment on the "
            "GPU, cache decoded data, pre-process offline) or use a faster storage format"
        )
    prefetch = loader.prefetch_factor or 2
    return (
        f"the {workers} workers cannot keep up: raise `num_workers` (this machine has {cpu_count} CPUs) or "
        f"`prefetch_factor` (now {prefetch}), or make each sample cheaper to load"
    )


class DataLoaderStall(RuntimeRule):
    code = "LA602"
    name = "data-loader-stall"
    summary = "The measured steps waited for batches not yet loaded for more than 5% of the step time."
    message = "the steps waited for this DataLoader's batches for more than 5% of their time"
    suggestion = "load batches in worker processes (`num_workers`), keep them alive (`persistent_workers=True`)"
    what_it_flags = (
        "A DataLoader whose `next()` kept the measured steps waiting for batches that were not loaded yet "
        "for more than 5% of their time (the share at which TensorBoard's PyTorch profiler plugin "
        "recommends more workers). `loopaudit run` times every `next()` on every DataLoader iterator in the "
        "script's process and looks, before each, whether a worker has already delivered the batch: handing "
        "over a delivered batch (unpickling it, receiving its shared memory) costs a millisecond or two "
        "whatever the settings, and is not counted; a single-process loader loads each batch on the "
        "step's time, and all of it counts. The share is judged on the steady steps with its 95% interval "
        "(batch means over consecutive steps): the rule reports only when the whole interval lies above 5%, "
        "and says the verdict is undecided, without a finding, when it straddles 5% after --max-steps. A "
        "run of steps twice as slow as the rest (a warm-up that had not ended, another job taking the "
        "CPUs) is left out and named. The loader is reported at the line that created it, with its real "
        "runtime settings (`num_workers`, `pin_memory`, `persistent_workers`, `prefetch_factor`, read from "
        "the live object, not from the source) and advice that follows from them: workers when there are "
        "none, `persistent_workers=True` when the wait is each epoch's worker start-up, more workers or "
        "cheaper samples when the workers cannot keep up. From a trace, it is the share of the steps spent "
        "in `enumerate(DataLoader)#...__next__` ranges while the GPU and the CUDA runtime were idle, "
        "computed the way the profiler plugin computes it."
    )
    why_it_costs = (
        "While the training process waits for a batch, nothing is queued for the GPU: the share of the step "
        "spent waiting is a share of the GPU's time lost. With `num_workers=0` every sample is read, "
        "decoded and collated in the training process itself, between steps; with workers, the batches for "
        "the next steps are prepared in parallel with the current one, and the wait disappears as long as "
        "the workers keep up."
    )
    example = (
        "loader = DataLoader(ImageFolder(root, transform=augment), batch_size=64, shuffle=True)\n"
        "for images, labels in loader:  # LA602: waits 58% of each step for the next batch\n"
        "    train_step(images.cuda(), labels.cuda())\n"
    )
    use_instead = (
        "loader = DataLoader(\n"
        "    ImageFolder(root, transform=augment), batch_size=64, shuffle=True,\n"
        "    num_workers=8, persistent_workers=True, pin_memory=True,\n"
        ")\n"
        "for images, labels in loader:\n"
        "    train_step(images.cuda(non_blocking=True), labels.cuda(non_blocking=True))\n"
    )
    fix_safety = (
        "No automatic fix: worker processes need a picklable dataset and a `__main__` guard under the "
        "spawn start method, and the right number depends on the machine."
    )
    valid = (
        # Samples already in memory: collating 64 of them costs little next to this model's step
        # (about 1% of it, well under the 5% threshold even on a busy machine).
        # (With batch_size=512 and a small model, collating alone takes over half the step.)
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "data = TensorDataset(torch.randn(8192, 64), torch.randint(0, 10, (8192,)))\n"
        "for x, y in DataLoader(data, batch_size=64):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import time\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Decoded(Dataset):\n"
        "    def __len__(self):\n"
        "        return 100000\n"
        "    def __getitem__(self, index):\n"
        "        time.sleep(0.0005)  # reading and decoding one sample\n"
        "        return torch.randn(16), index % 4\n"
        "model = torch.nn.Linear(16, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(Decoded(), batch_size=16)  # expect: LA602\n"
        "for x, y in loader:\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )

    data_wait_threshold = THRESHOLD

    def from_run(self, run):
        estimate = run.data_starvation
        if estimate is None or not run.step_seconds:
            return
        verdict = estimate.against(THRESHOLD)
        if verdict == "below":
            return
        if verdict == "inconclusive":
            yield Undecided(
                f"{self.code} undecided: the steps waited for batches not yet loaded {estimate.as_share()} of their "
                f"time over {steps_phrase(estimate.steps, 'steady')}, which straddles the {THRESHOLD:.0%} threshold; "
                f"measure more steps (`--max-steps {max(2 * run.steps_measured, 100)}`) to settle it"
            )
            return
        median = run.step_time.value
        loaders = sorted(run.loaders_in_window(), key=lambda entry: -entry[1].starved_seconds)
        # The estimate is over all loaders together: each one past the threshold on its own is named,
        # and the one that waited most when only their sum is past it.
        named = [loader for _, loader in loaders if loader.starved_seconds / run.step_seconds > THRESHOLD]
        for loader in named or [loaders[0][1]]:
            share = loader.starved_seconds / run.step_seconds
            waited = loader.starved_seconds * 1000 / run.steps_measured
            part = f"{share:.0%} ({estimate.as_share()} for all loaders)" if len(loaders) > 1 else estimate.as_share()
            message = (
                f"the steps waited for this DataLoader's batches {part} of the time over "
                f"{steps_phrase(estimate.steps, 'steady')} ({waited:.1f} ms per step, median step {median:.1f} ms); "
                f"it runs with {settings(loader)}"
            )
            file, line = (loader.file, loader.line) if loader.file else run.location_of_step()
            yield Observation(
                file=file,
                line=line,
                message=message,
                observed={
                    "per_step": run.per_step(loader.batches),
                    "total": loader.batches,
                    "time_ms": round(loader.starved_seconds * 1000, 3),
                    "share": round(share, 4),
                    "interval": [round(estimate.low, 4), round(estimate.high, 4)] if estimate.low is not None else None,
                },
                suggestion=advice(loader, run.report.cpu_count),
                details={
                    "loader": {
                        "dataset": loader.dataset,
                        "batch_size": loader.batch_size,
                        "num_workers": loader.num_workers,
                        "pin_memory": loader.pin_memory,
                        "persistent_workers": loader.persistent_workers,
                        "prefetch_factor": loader.prefetch_factor,
                    },
                },
            )

    def from_trace(self, trace):
        share = trace.dataloader_fraction
        if share is None or share <= THRESHOLD:
            return
        waited_us = sum(step.dataloader_us for step in trace.steps)
        names = ", ".join(f"`{name}`" for name in trace.dataloader_names)
        single_process = any("_SingleProcessDataLoaderIter" in name for name in trace.dataloader_names)
        frame = trace.dataloader_frame
        yield Observation(
            file=frame.file if frame else trace.path,
            line=frame.line if frame else None,
            message=f"the steps spent {share:.1%} of their time waiting for batches in {names}",
            observed={"per_step": None, "total": None, "time_ms": round(waited_us / 1000, 3), "share": round(share, 4)},
            suggestion=(
                "the trace shows a single-process DataLoader (`num_workers=0`): load batches in worker processes "
                "with `num_workers` and `persistent_workers=True`"
                if single_process
                else None
            ),
        )
