"""slow_loop.py with every finding fixed: `loopaudit scan examples/fast_loop.py` reports nothing.

    loopaudit run examples/fast_loop.py
"""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Images read and decoded on the fly: 2 ms a sample, as reading a JPEG from storage and decoding it take
    (a sleep, so that on a small CPU-only machine the loading does not also take the training's cores)."""

    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.002)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=generator), index % 10


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(64, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Workers load the next batches while the model trains; pinned memory makes the copies asynchronous.
    loader = DataLoader(
        SyntheticImages(), batch_size=32, shuffle=True, num_workers=2, pin_memory=True, persistent_workers=True,
    )

    for epoch in range(3):
        running = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(images)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += loss.detach()  # stays on the device: no sync
            correct += (logits.argmax(dim=1) == labels).sum()  # one kernel for the whole batch
        print(f"epoch {epoch}: loss {running.item() / len(loader):.3f}")  # one sync per epoch


if __name__ == "__main__":
    main()
