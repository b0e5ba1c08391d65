from __future__ import annotations

import libcst as cst

from loopaudit.call_edits import TRUE, with_keyword
from loopaudit.rule import Fix, Report, Rule
from ._loaders import is_host_batch, moves_to_device

_CREATION = frozenset({
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "rand",
    "randn", "randint", "randperm", "eye", "asarray",
})


def _created_here(expr: cst.BaseExpression, ctx) -> bool:
    """`torch.arange(n)` and `torch.ones(n).float()`: a tensor made by the script, not batch data (LA205's)."""
    while isinstance(expr, cst.Call):
        qualified = ctx.qualified_name(expr.func) or ""
        if qualified.startswith("torch.") and qualified.count(".") == 1:
            return qualified[6:] in _CREATION
        if not isinstance(expr.func, cst.Attribute):
            return False
        expr = expr.func.value
    return False


class BlockingBatchCopy(Rule):
    code = "LA202"
    name = "blocking-batch-copy"
    summary = "Batch data moved to the GPU with `.to(device)` / `.cuda()` without `non_blocking=True`, once per step."
    message = "a blocking host-to-device copy of the batch: the CPU waits for the GPU's queue to drain, once per step"
    suggestion = (
        "pin the batches (`DataLoader(..., pin_memory=True)`) and copy them with "
        "`.to(device, non_blocking=True)` / `.cuda(non_blocking=True)`"
    )
    what_it_flags = (
        "`.to(device)`, `.cuda()` and `.type(torch.cuda.FloatTensor)` of batch data (a tensor that comes from a "
        "DataLoader, or from whatever a training loop iterates, and has not been moved yet) in code that runs once per training or evaluation step of a CUDA script, when "
        "`non_blocking=True` is not passed. This includes moves inside a comprehension over the batch, "
        "such as `{k: v.to(device) for k, v in batch.items()}`, batches drawn with `next(train_iter)`, and "
        "batches converted first (`torch.from_numpy(batch[\"image\"]).to(device)`). Moving the model or a module "
        "(`model.to(device)`), dtype conversions (`.to(torch.float16)`), `.to(\"cpu\")` and moves of "
        "tensors the script creates itself (LA205) are not flagged."
    )
    why_it_costs = (
        "A host-to-device copy without `non_blocking=True` is synchronous: PyTorch issues "
        "`cudaMemcpyAsync` and then `cudaStreamSynchronize` on the current stream, so the Python thread "
        "waits until every kernel queued before the copy (the previous step's backward and optimizer "
        "step) has finished and the copy itself is done. The GPU's queue is empty when the copy returns, "
        "so the launch overhead of the next forward pass is no longer hidden behind GPU work. With "
        "`non_blocking=True` the copy is only queued on the stream: kernels that use the batch still run "
        "after it (same stream), and the host goes on launching them. The copy overlaps with the host's "
        "work only when the source is pinned (`pin_memory=True` on the DataLoader); from pageable memory "
        "CUDA first copies the batch into a staging buffer on the CPU."
    )
    example = (
        "for images, labels in train_loader:\n"
        "    images, labels = images.to(device), labels.to(device)\n"
        "    loss = criterion(model(images), labels)\n"
    )
    use_instead = (
        "train_loader = DataLoader(train_set, batch_size=256, num_workers=8, pin_memory=True)\n"
        "for images, labels in train_loader:\n"
        "    images = images.to(device, non_blocking=True)\n"
        "    labels = labels.to(device, non_blocking=True)\n"
        "    loss = criterion(model(images), labels)\n"
    )
    fix_safety = (
        "Fixed by `--fix` (safe): `non_blocking=True` is added (or replaces `non_blocking=False`). "
        "Safe for host-to-device copies on the current stream: later kernels on the same stream wait for "
        "the copy. Not safe to mirror for device-to-host copies, whose result the host must not read "
        "before a synchronization. Without pinned memory the change is harmless but gains little."
    )
    valid = (
        # A grid a helper builds from sizes alone is no batch (RAFT's `coords_grid`).
        "import torch\n"
        "from utils import coords_grid\n"
        "class RAFT(torch.nn.Module):\n"
        "    def forward(self, img):\n"
        "        n, c, h, w = img.shape\n"
        "        coords = coords_grid(n, h // 8, w // 8).to(img.device)\n"
        "        return self.update(img, coords)\n"
        "model = RAFT().cuda()\n"
        "for img, flow in loader:\n"
        "    loss = model(img.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A helper of the script applied to a tensor the script makes is not batch data (LA205's if anything).
        "import torch\n"
        "def label2onehot(labels, dim):\n"
        "    out = torch.zeros(labels.size(0), dim)\n"
        "    out[torch.arange(labels.size(0)), labels.long()] = 1\n"
        "    return out\n"
        "model = Net().cuda()\n"
        "for x, y in test_loader:\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    mask = label2onehot(torch.zeros(x.size(0)), 2).to('cuda')\n"
        "    out = model(x, mask)\n",
        "import torch\n"
        "device = torch.device('cuda')\n"
        "model = Net().to(device)\n"
        "for x, y in train_loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    y = y.cuda(non_blocking=True)\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Dtype conversions and moves to the CPU are no host-to-device copies; the batch is already moved.
        "import torch\n"
        "model.cuda()\n"
        "for x, y in train_loader:\n"
        "    x = x.to(torch.float16)\n"
        "    y_host = y.to('cpu')\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    out = model(x).to(x.device)\n"
        "    loss = out.sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, before the loop: the model and a fixed batch for visualisation.
        "import torch\n"
        "device = 'cuda'\n"
        "fixed_x, _ = next(iter(val_loader))\n"
        "fixed_x = fixed_x.to(device)\n"
        "model.to(device)\n",
    )
    invalid = (
        # Drawn with `next()` from an iterator of any name in a loop that trains, moved to the device a
        # helper names (OpenAI's diffusion code: `dist_util.dev()`).
        "import torch\n"
        "import dist_util\n"
        "class TrainLoop:\n"
        "    def __init__(self, model, data):\n"
        "        self.model, self.data = model.cuda(), data\n"
        "    def run_loop(self):\n"
        "        while self.step < self.total_steps:\n"
        "            batch, cond = next(self.data)\n"
        "            self.run_step(batch, cond)\n"
        "    def run_step(self, batch, cond):\n"
        "        micro = batch.to(dist_util.dev())  # expect: LA202\n"
        "        loss = self.model(micro).mean()\n"
        "        loss.backward()\n"
        "        self.opt.step()\n",
        # Moved together in one tuple assignment after the block reshaped them (PointNet).
        "import torch\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)\n"
        "for i, data in enumerate(loader, 0):\n"
        "    points, target = data\n"
        "    target = target[:, 0]\n"
        "    points = points.transpose(2, 1)\n"
        "    points, target = points.cuda(), target.cuda()  # expect: LA202\n"
        "    loss = criterion(model(points), target)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if i % 10 == 0:\n"
        "        j, data = next(enumerate(test_loader, 0))\n"
        "        points, target = data\n"
        "        points = points.transpose(2, 1)\n"
        "        points, target = points.cuda(), target.cuda()\n"
        "        print(criterion(model(points), target))\n",
        # The legacy move by tensor type, and a batch from a loop that trains whatever it iterates.
        "import torch\n"
        "Tensor = torch.cuda.FloatTensor\n"
        "for imgs, targets in batches_of(dataset):\n"
        "    imgs = imgs.type(Tensor)  # expect: LA202\n"
        "    targets = targets.to('cuda')  # expect: LA202\n"
        "    loss = model(imgs, targets).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Labels derived from the batch before the batch's own labels are moved (StarGAN).
        "import torch\n"
        "device = torch.device('cuda')\n"
        "data_iter = iter(data_loader)\n"
        "for i in range(num_iters):\n"
        "    x_real, label_org = next(data_iter)\n"
        "    label_trg = label_org[torch.randperm(label_org.size(0))]\n"
        "    c_org = label_org.clone()\n"
        "    x_real = x_real.to(device)  # expect: LA202\n"
        "    c_org = c_org.to(device)  # expect: LA202\n"
        "    label_org = label_org.to(device)  # expect: LA202\n"
        "    label_trg = label_trg.to(device)  # expect: LA202\n"
        "    loss = G(x_real, c_org, label_org, label_trg).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Batches drawn with `next()` from an endless iterator, and a batch converted from NumPy.
        "import torch\n"
        "device = 'cuda'\n"
        "train_iter = iter(train_loader)\n"
        "for step in range(100_000):\n"
        "    batch = next(train_iter)\n"
        "    images = batch.to(device)  # expect: LA202\n"
        "    labels = torch.from_numpy(batch_labels(batch).numpy()).to(device)  # expect: LA202\n"
        "    loss = criterion(model(images), labels)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "for epoch in range(10):\n"
        "    for i, (inputs, labels) in enumerate(trainloader):\n"
        "        inputs, labels = inputs.to(device), labels.to(device)  # expect: LA202\n"
        "        outputs = net(inputs)\n"
        "        loss = criterion(outputs, labels)\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # A dict batch moved in a comprehension, and `.cuda()` in an evaluation loop.
        "import torch\n"
        "model.cuda()\n"
        "for batch in train_dataloader:\n"
        "    batch = {k: v.to('cuda') for k, v in batch.items()}  # expect: LA202\n"
        "    loss = model(**batch).loss\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "with torch.no_grad():\n"
        "    for data, target in test_loader:\n"
        "        output = model(data.cuda())  # expect: LA202\n",
        # Detection-style batches: lists of images and of target dicts, moved one by one.
        "import torch\n"
        "def train_one_epoch(model, optimizer, data_loader, device):\n"
        "    for images, targets in data_loader:\n"
        "        images = list(image.to(device) for image in images)  # expect: LA202\n"
        "        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]  # expect: LA202\n"
        "        losses = sum(model(images, targets).values())\n"
        "        losses.backward()\n"
        "        optimizer.step()\n"
        "model = torchvision.models.detection.fasterrcnn_resnet50_fpn().cuda()\n"
        "loader = torch.utils.data.DataLoader(dataset, num_workers=4, pin_memory=True)\n"
        "for epoch in range(10):\n"
        "    train_one_epoch(model, optimizer, loader, torch.device('cuda'))\n",
        # Nothing names CUDA, but `non_blocking=True` only matters with a GPU (yolov5's val.py).
        "import torch\n"
        "@torch.no_grad()\n"
        "def run(model, dataloader, device):\n"
        "    for batch_i, (im, targets, paths, shapes) in enumerate(dataloader):\n"
        "        im = im.to(device, non_blocking=True)\n"
        "        targets = targets.to(device)  # expect: LA202\n"
        "        preds = model(im)\n",
    )

    confirmed_by = ("LA601",)
    confirmable_on_cpu = False  # a CPU run never copies to a device
    node_types = (cst.Call,)

    def check(self, node, ctx):
        receiver = moves_to_device(node, ctx)
        if receiver is None or _created_here(receiver, ctx) or not is_host_batch(receiver, ctx):
            return
        yield Report(
            node,
            f"`{ctx.source(node)}` is a blocking host-to-device copy of the batch: the CPU waits for the "
            "GPU's queue to drain, once per step",
            fix=Fix("pass `non_blocking=True`", ((node, with_keyword(node, "non_blocking", TRUE)),)),
        )
