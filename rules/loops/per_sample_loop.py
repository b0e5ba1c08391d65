from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext
from loopaudit.rules.loops._per_sample import per_sample_work


class PerSampleLoop(Rule):
    code = "LA301"
    name = "per-sample-loop"
    summary = "A Python loop over the samples of a batch that does tensor work per sample, once per step."
    message = "this loop does tensor work once per sample: N small kernel launches per step where one batched operation would do"
    suggestion = (
        "operate on the whole batch at once: index with tensors (`x[idx]`), reduce along a dimension "
        "(`loss.sum(dim=0)`), or use `torch.vmap`, `index_add_`/`scatter_add_` for per-sample scatters"
    )
    what_it_flags = (
        "A `for` loop in code that runs once per step (on any device) whose iterations walk the first "
        "dimension of a tensor: `for i in range(x.size(0))`, `range(len(labels))`, `range(batch_size)` "
        "when `batch_size = x.shape[0]`, `range(x.numel())`, or `for sample in batch` / "
        "`for p, t in zip(preds, targets)` over tensors, and whose body does tensor work with each element: "
        "a forward pass or a torch function of `x[i]`, a tensor method that computes or reads back "
        "(`x[i].sum()`, `y[i].item()`), or arithmetic on it. Not flagged: step loops themselves (a "
        "gradient-accumulation loop over micro-batches), loops with a stride (`range(0, n, chunk)`), "
        "recurrences that feed one iteration's result into the next (`h = cell(x[t], h)`), ragged loops "
        "that slice each row to its own length (`x[i, :lengths[i]]`), loops over other dimensions, and "
        "loops whose body only moves or casts each element (`t.to(device)`), loops whose elements the body "
        'uses as text (`"loss_for_" + fname`, `name.endswith(".png")`: file names or captions, not '
        "rows), and loops over a tokenizer's output (`ids = tokenizer.encode(token)`, a Python list unless "
        "`return_tensors=` is passed), loops over what a model returns or what callers pass (a tuple of heads, "
        "one output per scale or per discriminator), and loops inside `if isinstance(x, (list, tuple)):` or "
        "`if type(x) is tuple:` for the walked name. Comprehensions are not checked."
    )
    why_it_costs = (
        "Every tensor operation is dispatched by Python and, on a GPU, launched as its own kernel: several "
        "microseconds of CPU time each, however small the tensor. A loop over a batch of N turns one "
        "kernel over N rows into N kernels over one row each, so the step costs N times the launch "
        "overhead and the GPU runs tiny kernels that use a fraction of its cores. A `.item()` inside the "
        "loop is a host-device sync per sample. On a CPU the per-op dispatch overhead (and losing "
        "vectorized, multi-threaded kernels) costs the same way."
    )
    example = (
        "for x, y in loader:\n"
        "    x, y = x.cuda(), y.cuda()\n"
        "    loss = 0\n"
        "    for i in range(x.size(0)):\n"
        "        loss = loss + criterion(model(x[i].unsqueeze(0)), y[i].unsqueeze(0))\n"
        "    (loss / x.size(0)).backward()\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    x, y = x.cuda(), y.cuda()\n"
        "    loss = criterion(model(x), y)  # reduction='mean' averages over the batch\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    fix_safety = (
        "No automatic fix: the batched form depends on what the body computes, and layers such as "
        "BatchNorm behave differently on a batch of one than on the whole batch."
    )
    valid = (
        # A multi-scale discriminator returns one output per scale, and a loss made robust to single
        # outputs wraps them in a list first (melgan, SfmLearner).
        "import torch\n"
        "import torch.nn.functional as F\n"
        "def explainability_loss(mask):\n"
        "    if type(mask) not in [tuple, list]:\n"
        "        mask = [mask]\n"
        "    loss = 0\n"
        "    for mask_scaled in mask:\n"
        "        loss += F.binary_cross_entropy(mask_scaled, torch.ones_like(mask_scaled))\n"
        "    return loss\n"
        "netD = Discriminator().cuda()\n"
        "for x, y in train_loader:\n"
        "    D_real = netD(x.cuda(non_blocking=True))\n"
        "    loss_D = 0\n"
        "    for scale in D_real:\n"
        "        loss_D += F.relu(1 - scale[-1]).mean()\n"
        "    (loss_D + explainability_loss(D_real)).backward()\n",
        # A multi-scale loss walks the tuple of outputs, one per scale (FlowNet2's MultiScale).
        "import torch\n"
        "class MultiScale(torch.nn.Module):\n"
        "    def forward(self, output, target):\n"
        "        loss = 0\n"
        "        if type(output) is tuple:\n"
        "            for i, output_ in enumerate(output):\n"
        "                loss += self.weights[i] * (output_ - self.pools[i](target)).abs().mean()\n"
        "            return loss\n"
        "        return (output - target).abs().mean()\n"
        "model = Net().cuda()\n"
        "criterion = MultiScale()\n"
        "for x, y in train_loader:\n"
        "    criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True)).backward()\n",
        # A helper walking what it is handed: a model's outputs may be a tuple of heads (YOLO's three
        # detection layers), not a batch.
        "import torch\n"
        "def compute_loss(predictions, targets):\n"
        "    loss = 0\n"
        "    for layer_predictions in predictions:\n"
        "        loss = loss + layer_predictions.sigmoid().mean()\n"
        "    return loss\n"
        "model = Net().cuda()\n"
        "for imgs, targets in train_loader:\n"
        "    loss = compute_loss(model(imgs.cuda(non_blocking=True)), targets)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Batched: no per-sample loop.
        "import torch\n"
        "model.cuda()\n"
        "for x, y in train_loader:\n"
        "    out = model(x.cuda())\n"
        "    loss = criterion(out, y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Moving each field of the batch tuple, a recurrence over time steps, a ragged loop, and a
        # gradient-accumulation loop over micro-batches (a step loop itself).
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for batch in train_loader:\n"
        "    for t in batch:\n"
        "        t.to(device)\n"
        "    x, lengths = batch\n"
        "    x = x.to(device)\n"
        "    h = torch.zeros(x.size(1), 128, device=device)\n"
        "    for t in range(x.size(0)):\n"
        "        h = cell(x[t], h)\n"
        "    for i in range(x.size(0)):\n"
        "        total = total + x[i, :lengths[i]].sum()\n"
        "    for micro in range(0, x.size(0), micro_bs):\n"
        "        loss = model(x[micro:micro + micro_bs]).mean()\n"
        "        loss.backward()\n"
        "    optimizer.step()\n",
        # Once per epoch, not per step.
        "import torch\n"
        "for epoch in range(epochs):\n"
        "    for x, y in train_loader:\n"
        "        loss = model(x.cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    for i in range(len(probe)):\n"
        "        print(model(probe[i].cuda()).argmax())\n",
        # Text, not samples: the batch's file names logged under a debug option, and the ids a
        # tokenizer gives for one token (a Python list).
        "import torch\n"
        "def get_mask(tokenizer, accelerator):\n"
        "    mask = torch.ones(len(tokenizer)).to(accelerator.device, dtype=torch.bool)\n"
        "    for token in tokenizer.token_map:\n"
        "        ids = tokenizer.encode(token, add_special_tokens=False)\n"
        "        for i in range(len(ids)):\n"
        "            mask = mask & (torch.arange(len(tokenizer)) != ids[i]).to(accelerator.device)\n"
        "    return mask\n"
        "model.cuda()\n"
        "for step, batch in enumerate(train_dataloader):\n"
        "    loss = model(batch['pixel_values'].cuda()).mean()\n"
        "    if args.debug_loss and 'filenames' in batch:\n"
        "        for fname in batch['filenames']:\n"
        "            accelerator.log({'loss_for_' + fname: loss}, step=step)\n"
        "    loss.backward()\n"
        "    grads = get_mask(tokenizer, accelerator)\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "device = 'cuda'\n"
        "for inputs, labels in train_loader:\n"
        "    inputs, labels = inputs.to(device), labels.to(device)\n"
        "    loss = 0.0\n"
        "    for i in range(inputs.size(0)):  # expect: LA301\n"
        "        out = model(inputs[i].unsqueeze(0))\n"
        "        loss = loss + F.cross_entropy(out, labels[i].unsqueeze(0))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Evaluation: per-sample accuracy with a sync per sample.
        "import torch\n"
        "model.cuda()\n"
        "with torch.no_grad():\n"
        "    for images, targets in val_loader:\n"
        "        preds = model(images.cuda()).argmax(dim=1)\n"
        "        n = targets.shape[0]\n"
        "        for j in range(n):  # expect: LA301\n"
        "            correct += (preds[j] == targets[j].cuda()).item()\n"
        "        for p, t in zip(preds, targets):  # expect: LA301\n"
        "            per_class[t.item()] += (p == t.cuda()).item()\n",
        # A name the same iteration assigns and then rebinds is no recurrence (WS-DAN's attention crops).
        "import torch\n"
        "import torch.nn.functional as F\n"
        "model.cuda()\n"
        "for x, y in train_loader:\n"
        "    maps = model(x.cuda(non_blocking=True))\n"
        "    picked = []\n"
        "    for i in range(x.size(0)):  # expect: LA301\n"
        "        weights = maps[i].sum(dim=(1, 2))\n"
        "        weights = F.normalize(weights, p=1, dim=0)\n"
        "        picked.append(maps[i, weights.argmax()])\n"
        "    criterion(torch.stack(picked), y.cuda(non_blocking=True)).backward()\n"
        "    optimizer.step()\n",
    )

    node_types = (cst.For,)
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.For, node)  # node_types
        evidence = per_sample_work(node, ctx)
        if evidence is not None:
            header = ctx.source(node.iter, 36)
            yield Report(
                node,
                f"`for ... in {header}` runs `{ctx.source(evidence, 36)}` once per sample: N small kernel "
                "launches per step where one batched operation would do",
            )
