"""A loop with nothing to report: two persistent workers stay ahead of a small model, the loss is
read every 50 steps. Its steps take a few milliseconds, so the hand-over of each batch from a worker
(a millisecond or two) is a large share of the step: the case that tells starving for data from
receiving it."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(20_000, 64), torch.randint(0, 10, (20_000,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    for _ in range(100):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 50 == 0:
                print(f"step {step}: loss {loss.item():.3f}")
            step += 1


if __name__ == "__main__":
    main()
