"""A CUDA training loop with known habits, for checking `loopaudit run --profile` on a real GPU.

Per step: two pageable blocking batch copies (LA603), `.item()` (a sync from Python), `nonzero()`
(a sync made inside C++), an `if` on a GPU tensor (a sync through `__bool__`), and
`torch.cuda.empty_cache()` (LA604). docs/gpu-validation.md records what loopaudit reported for it.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(4096, 1024), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=256)  # pageable batches, no workers
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
for epoch in range(10):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()  # blocking copies from pageable memory
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        hard = (y > 5).nonzero()  # a sync inside C++: the output's size depends on the data
        if loss > 100:  # a sync through Tensor.__bool__
            print("diverged", hard.shape)
        print(loss.item())  # a sync from Python
        torch.cuda.empty_cache()  # hands the cached blocks back every step
