from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import TORCH_FACTORIES, TRUE, Fix, Kind, Report, Rule, RuleContext, with_keyword
from loopaudit.rules.data._loaders import is_host_batch, moves_to_device
from loopaudit.rules.data.tensor_created_on_host_then_moved import (
    DTYPE_METHODS,
    host_created,
    kept_attribute,
)

_CREATION = TORCH_FACTORIES | {"tensor", "as_tensor", "asarray"}


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
        "`.to(device, non_blocking=True)` / `.cuda(non_blocking=True)`; convert dtypes after the copy "
        "(`x.to(device, non_blocking=True).float()`)"
    )
    what_it_flags = (
        "`.to(device)`, `.cuda()` and `.type(torch.cuda.FloatTensor)` of batch data (a tensor that comes from a "
        "DataLoader, or from whatever a training loop iterates, and has not been moved yet) in code that runs once per training or evaluation step of a CUDA script, when "
        "`non_blocking=True` is not passed. This includes moves inside a comprehension over the batch, "
        "such as `{k: v.to(device) for k, v in batch.items()}`, batches drawn with `next(train_iter)`, and "
        'batches converted first (`torch.from_numpy(batch["image"]).to(device)`), also when the batch is handed to '
        "the function that converts it (`update_params(batch)`: `torch.from_numpy(np.stack(batch.state)).to(device)`). Moving the model or a module "
        '(`model.to(device)`), dtype conversions (`.to(torch.float16)`), `.to("cpu")` and moves of '
        "tensors the script creates itself (LA205) are not flagged, nor are batches of a loader that HF Accelerate "
        "or Fabric prepared (`accelerator.prepare(...)`, `fabric.setup_dataloaders(...)`, also unpacked under new "
        "names), which arrive on the device already. Nor is a tensor an object keeps from its `__init__` "
        "(`self.mean.to(x.device)`): LA205 reports that one. A dtype conversion right before the copy "
        "(`x.float().to(device)`, `y.long().cuda()`) gets its own advice: it converts on the CPU into a new, "
        "unpinned tensor, so that the batch is better copied first and converted on the GPU."
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
        "CUDA first copies the batch into a staging buffer on the CPU. A dtype conversion before the copy "
        "(`labels.long()`) runs on the CPU and writes a new tensor in pageable memory: a pinned batch loses its "
        "pinning, and the host spends the step's time converting."
    )
    example = (
        "for images, labels in train_loader:\n"
        "    images, labels = images.to(device), labels.long().to(device)\n"
        "    loss = criterion(model(images), labels)\n"
    )
    use_instead = (
        "train_loader = DataLoader(train_set, batch_size=256, num_workers=8, pin_memory=True)\n"
        "for images, labels in train_loader:\n"
        "    images = images.to(device, non_blocking=True)\n"
        "    labels = labels.to(device, non_blocking=True).long()  # convert after the copy, on the GPU\n"
        "    loss = criterion(model(images), labels)\n"
    )
    fix_safety = (
        "Fixed by `--fix` (safe): `non_blocking=True` is added (or replaces `non_blocking=False`). "
        "Safe for host-to-device copies on the current stream: later kernels on the same stream wait for "
        "the copy. Not safe to mirror for device-to-host copies, whose result the host must not read "
        "before a synchronization. Without pinned memory the change is harmless but gains little. "
        "A conversion before the copy (`x.float().to(device)`) is fixed only with `--unsafe-fixes`, by copying "
        "first and converting after (`x.to(device, non_blocking=True).float()`): the result has the same dtype "
        "and device, but the conversion runs on the GPU (casts of NaN or out-of-range floats to integers may "
        "differ from the CPU's), the copy carries the original dtype (twice the bytes for float64 to float32), "
        "and the GPU holds both tensors for a moment. No fix where the move sets the dtype too "
        "(`.to(other_tensor)`, `.to(device, dtype)`), nor for an attribute the model keeps (the fix is a buffer, "
        "which changes what the model holds; `non_blocking=True` from its pageable memory would only hide it)."
    )
    valid = (
        # A parameter rebound to its own values read back (glow-tts' `maximum_path`): a round trip too.
        "import numpy as np\n"
        "import torch\n"
        "model = Net().cuda()\n"
        "def maximum_path(value, mask):\n"
        "    device = value.device\n"
        "    value = value.data.cpu().numpy()\n"
        "    path = np.zeros_like(value)\n"
        "    return torch.from_numpy(path).to(device=device)\n"
        "for x, y in loader:\n"
        "    logp = model(x.cuda(non_blocking=True))\n"
        "    attn = maximum_path(logp, y.cuda(non_blocking=True))\n"
        "    loss = (logp * attn).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A model output read back, flipped on the host and sent back: a round trip, not input data.
        "import torch\n"
        "model = Net().cuda()\n"
        "def flip_lr(x):\n"
        "    tmp = x.detach().cpu().numpy()[..., ::-1].copy()\n"
        "    return torch.from_numpy(tmp).to(x.device)\n"
        "for images, labels in loader:\n"
        "    out = model(images.cuda(non_blocking=True))\n"
        "    loss = criterion(out + flip_lr(out), labels.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # torchtext's iterator puts each batch on the device itself: the `.to(device)` moves nothing.
        "import torch\n"
        "from torchtext.data import BucketIterator\n"
        "device = torch.device('cuda')\n"
        "model = Net().to(device)\n"
        "def train_epoch(model, training_data):\n"
        "    for batch in training_data:\n"
        "        src = batch.src.transpose(0, 1).to(device)\n"
        "        model(src).sum().backward()\n"
        "train_iterator = BucketIterator(train, batch_size=64, device=device, train=True)\n"
        "for epoch in range(10):\n"
        "    train_epoch(model, train_iterator)\n",
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
        "model.to(device)\n",  # HF Accelerate puts the batches of a prepared loader on the device itself: unpacked under new
        # names, under the same names (the HF examples), and prepared alone.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "device = accelerator.device\n"
        "model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_loader)\n"
        "for epoch in range(3):\n"
        "    for x, y in train_dl:\n"
        "        x, y = x.to(device), y.to(device)\n"
        "        loss = criterion(model(x), y)\n"
        "        accelerator.backward(loss)\n"
        "        optimizer.step()\n",
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from torch.utils.data import DataLoader\n"
        "accelerator = Accelerator()\n"
        "def main():\n"
        "    train_dataloader = DataLoader(train_set, batch_size=32, num_workers=4, pin_memory=True)\n"
        "    eval_dataloader = DataLoader(eval_set, batch_size=64, num_workers=4, pin_memory=True)\n"
        "    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(\n"
        "        model, optimizer, train_dataloader, eval_dataloader\n"
        "    )\n"
        "    for step, batch in enumerate(train_dataloader):\n"
        "        batch = {k: v.to(accelerator.device) for k, v in batch.items()}\n"
        "        loss = model(**batch).loss\n"
        "        accelerator.backward(loss)\n"
        "        optimizer.step()\n"
        "    for batch in eval_dataloader:\n"
        "        logits = model(batch['input_ids'].cuda()).logits\n",
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from torch.utils.data import DataLoader\n"
        "accelerator = Accelerator()\n"
        "train_dataloader = DataLoader(train_set, batch_size=32, num_workers=4, pin_memory=True)\n"
        "train_dataloader = accelerator.prepare(train_dataloader)\n"
        "model = Net().to(accelerator.device)\n"
        "for inputs, labels in train_dataloader:\n"
        "    inputs, labels = inputs.to(accelerator.device), labels.cuda()\n"
        "    loss = criterion(model(inputs.float()), labels)\n"
        "    accelerator.backward(loss)\n"
        "    optimizer.step()\n",
        # A constant the model registered as a buffer moves with `model.to(device)`: nothing to copy.
        "import torch\n"
        "class Normalize(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.register_buffer('mean', torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), persistent=False)\n"
        "    def forward(self, x):\n"
        "        return x - self.mean.to(x.device)\n"
        "model = Normalize().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # self-critical.pytorch: the batch's fields listed, then each moved in a comprehension.
        "import torch\n"
        "model = Net().cuda()\n"
        "for it in range(max_iter):\n"
        "    data = loader.get_batch('train')\n"
        "    tmp = [data['fc_feats'], data['att_feats'], data['labels']]\n"
        "    tmp = [_ if _ is None else _.cuda() for _ in tmp]  # expect: LA202\n"
        "    fc_feats, att_feats, labels = tmp\n"
        "    loss = model(fc_feats, att_feats, labels).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A project's own NumPy iterator hands back a batch (Precipitation-Nowcasting), moved to the
        # device a settings object names.
        "import numpy as np\n"
        "import torch\n"
        "from config import cfg\n"
        "model = Net().cuda()\n"
        "for it in range(max_iterations):\n"
        "    batch, mask = data_iter.sample(batch_size=batch_size)\n"
        "    x = torch.from_numpy(batch.astype(np.float32)).to(cfg.GLOBAL.DEVICE)  # expect: LA202\n"
        "    loss = model(x).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A batch drawn with the iterator's own `next()` method, the Python 2 spelling (monodepth2).
        "import torch\n"
        "class Trainer:\n"
        "    def __init__(self, loader):\n"
        "        self.device = torch.device('cuda')\n"
        "        self.model = Net().to(self.device)\n"
        "        self.loader = loader\n"
        "        self.train_iter = iter(self.loader)\n"
        "    def train(self):\n"
        "        for step in range(num_steps):\n"
        "            images = self.train_iter.next()\n"
        "            loss = self.model(images.to(self.device)).mean()  # expect: LA202\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n",
        # A rollout handed to the update function, converted from NumPy and moved once per iteration.
        "import numpy as np\n"
        "import torch\n"
        "device = torch.device('cuda')\n"
        "dtype = torch.float32\n"
        "policy = Policy().to(device)\n"
        "def update_params(batch):\n"
        "    states = torch.from_numpy(np.stack(batch.state)).to(dtype).to(device)  # expect: LA202\n"
        "    loss = policy(states).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "for i_iter in range(max_iter_num):\n"
        "    batch = agent.collect_samples(2048)\n"
        "    update_params(batch)\n",
        # A step helper that moves the batch it is handed onto its own parameter's name.
        "import torch\n"
        "device = torch.device('cuda')\n"
        "model = Net().to(device)\n"
        "def train_step(x, y):\n"
        "    x = x.to(device)  # expect: LA202\n"
        "    loss = criterion(model(x), y.to(device, non_blocking=True))\n"
        "    loss.backward()\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        train_step(x, y)\n",
        # A comprehension's own target is the batch's element, whatever a name outside it holds
        # (ParallelWaveGAN's `_parse_batch`, where `x` is also the moved result).
        "import torch\n"
        "device = torch.device('cuda')\n"
        "model = Net().to(device)\n"
        "for inputs, targets in train_loader:\n"
        "    if isinstance(inputs, torch.Tensor):\n"
        "        x = inputs.to(device, non_blocking=True)\n"
        "    else:\n"
        "        x = [x.to(device) for x in inputs]  # expect: LA202\n"
        "    loss = model(*x).sum()\n"
        "    loss.backward()\n",
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
        # Converted on the host, then copied: the conversion makes a new, unpinned tensor. Fixed (unsafely)
        # by copying first and converting on the GPU, except where `.to(other)` sets the dtype too.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "device = torch.device('cuda')\n"
        "loader = DataLoader(dataset, batch_size=64, num_workers=4, pin_memory=True)\n"
        "for images, labels, masks, depth in loader:\n"
        "    images = images.float().to(device)  # expect: LA202\n"
        "    labels = labels.long().cuda()  # expect: LA202\n"
        "    masks = masks.half().to(device, non_blocking=False)  # expect: LA202\n"
        "    out = model(images, masks)\n"
        "    depth = depth.double().to(out)  # expect: LA202\n"
        "    loss = criterion(out, labels) + (out - depth).abs().mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
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

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        receiver = moves_to_device(node, ctx)
        if receiver is None or _created_here(receiver, ctx) or not is_host_batch(receiver, ctx):
            return
        if host_created(receiver, ctx) is not None or kept_attribute(receiver, ctx) is not None:
            return  # a tensor the script builds itself, or one an object keeps from `__init__`: LA205's
        conversion = _host_conversion(receiver, node)
        if conversion is not None:
            yield _converted_first(node, conversion, ctx)
            return
        yield Report(
            node,
            f"`{ctx.source(node)}` is a blocking host-to-device copy of the batch: the CPU waits for the "
            "GPU's queue to drain, once per step",
            fix=Fix("pass `non_blocking=True`", ((node, with_keyword(node, "non_blocking", TRUE)),)),
        )


def _host_conversion(receiver: cst.BaseExpression, move: cst.Call) -> cst.Call | None:
    """`x.float()` in `x.float().to(device)`: a dtype conversion made on the host right before the copy."""
    if cast(cst.Attribute, move.func).attr.value not in ("to", "cuda") or not isinstance(receiver, cst.Call):
        return None
    func = receiver.func
    return (
        receiver if isinstance(func, cst.Attribute) and func.attr.value in DTYPE_METHODS and not receiver.args else None
    )


def _converted_first(move: cst.Call, conversion: cst.Call, ctx) -> Report:
    """`x.float().to(device)` -> `x.to(device, non_blocking=True).float()`: copy the batch as it is
    (pinned, and often smaller: uint8 images, int32 tokens), convert on the GPU."""
    method = cast(cst.Attribute, conversion.func).attr.value
    converted = f"`.{method}()`" if not conversion.args else f"`.{method}(...)`"
    message = (
        f"`{ctx.source(move)}` converts the batch on the host before a blocking copy: {converted} makes a new, "
        "unpinned host tensor (the CPU converts it, and a pinned batch loses its pinning), then the CPU waits for "
        "the GPU's queue to drain, once per step: copy first, convert on the GPU"
    )
    # The rewrite keeps the result only where the move sets nothing but the device: `.to(other)`
    # takes the other tensor's dtype too, and `.to(device, dtype)` converts once more.
    target = [a.value for a in move.args if a.keyword is None or a.keyword.value == "device"]
    blocking = [a for a in move.args if a.keyword is not None and a.keyword.value == "non_blocking"]
    if cast(cst.Attribute, move.func).attr.value == "to" and (
        len(target) != 1
        or len(move.args) != 1 + len(blocking)
        or ctx.kind(target[0]) in (Kind.TENSOR, Kind.HOST_TENSOR)
    ):
        return Report(move, message)
    copied = with_keyword(
        move.with_changes(func=move.func.with_changes(value=cast(cst.Attribute, conversion.func).value)),
        "non_blocking",
        TRUE,
    )
    rewritten = conversion.with_changes(func=conversion.func.with_changes(value=copied))
    written = ctx.source(rewritten, 60)
    return Report(
        move,
        f"{message} (`{written}`)",
        fix=Fix(f"copy first, convert after: `{written}`", ((move, rewritten),), safe=False),
    )
