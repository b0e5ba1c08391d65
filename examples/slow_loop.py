"""A small training loop with the habits that keep a GPU idle, for `loopaudit scan` and `loopaudit run`.

Torch only, synthetic data, runs on a CUDA GPU when there is one and on the CPU otherwise. Its fixed
twin is fast_loop.py: diff the two to see what each finding asks for.

    loopaudit scan examples/slow_loop.py
    loopaudit run examples/slow_loop.py
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
    loader = DataLoader(SyntheticImages(), batch_size=32, shuffle=True)  # no workers, no pinned memory

    for epoch in range(3):
        running = 0.0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)  # blocking copies
            logits = model(images)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()  # waits for the GPU every step
            correct = 0
            for i in range(labels.size(0)):  # one tiny kernel launch per sample
                correct += (logits[i].argmax() == labels[i]).float()
        print(f"epoch {epoch}: loss {running / len(loader):.3f}")


if __name__ == "__main__":
    main()
