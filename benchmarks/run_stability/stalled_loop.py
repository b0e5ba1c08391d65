"""A loop starved by its data: each sample takes 4 ms to "read" (a sleep, as slow storage or decoding
takes), one worker loads batches of 32, about 130 ms a batch against a step of a millisecond."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowSamples(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep(0.004)
        return torch.randn(64), index % 10


def main():
    loader = DataLoader(SlowSamples(), batch_size=32, num_workers=1)
    model = torch.nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
