"""A small DDP training job on the CPU (gloo), for `loopaudit run --nproc-per-node 2`.

Run it the way torchrun runs it (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment):

    loopaudit run --nproc-per-node 2 examples/ddp_train.py
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py

Switches that put one of the distributed problems into it:
    --accumulation K     accumulate K micro-batches per optimizer step, without `no_sync()`
    --no-sync            ... and with it, around the forward and the backward (the fix)
    --log-every-step     all-reduce the loss on every step, only to print it on rank 0
    --slow-rank R        rank R's dataset takes --slow-ms per sample: a straggler
    --fail-rank R        rank R raises at step --fail-step
    --hang-rank R        rank R stops at step --fail-step (a deadlock, a stuck read) and never goes on
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--accumulation", type=int, default=1)
parser.add_argument("--no-sync", action="store_true")
parser.add_argument("--log-every-step", action="store_true")
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-ms", type=float, default=4.0)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=8)
parser.add_argument("--hang-rank", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Features(Dataset):
    """Synthetic samples; on --slow-rank each one takes --slow-ms to make (a slow disk, heavy decoding)."""

    def __init__(self, size: int, delay: float) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, 64, generator=generator)
        self.y = torch.randint(0, 10, (size,), generator=generator)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        return self.x[index], self.y[index]


dataset = Features(4096, args.slow_ms / 1000 if rank == args.slow_rank else 0.0)
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=1, persistent_workers=True)

model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = torch.nn.CrossEntropyLoss()

step = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        boundary = (i + 1) % args.accumulation == 0
        skip_sync = args.no_sync and not boundary
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            loss = criterion(model(x), y) / args.accumulation
            loss.backward()
        if not boundary:
            continue
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"rank {rank} failed at step {step}")
        if rank == args.hang_rank and step == args.fail_step:
            time.sleep(3600)
        if args.log_every_step:
            reported = loss.detach().clone()
            dist.all_reduce(reported, op=dist.ReduceOp.SUM)
            if rank == 0 and step % args.log_interval == 0:
                print(f"step {step}: loss {reported.item() / world_size:.3f}")
        elif step % args.log_interval == 0 and rank == 0:
            print(f"step {step}: loss {loss.item():.3f}")

dist.destroy_process_group()
if os.environ.get("RANK") == "0":
    print("done")
