from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Fix, Report, Rule, RuleContext, iter_subtree

_EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})


class EmptyCacheInStep(Rule):
    code = "LA401"
    name = "empty-cache-in-step"
    summary = "`torch.cuda.empty_cache()` once per step."
    message = (
        "`torch.cuda.empty_cache()` hands the allocator's cached blocks back to the driver every step: the "
        "next step allocates them again with `cudaMalloc`, which synchronizes"
    )
    suggestion = (
        "remove it from the step (PyTorch reuses its cached memory on its own); if fragmentation causes "
        "OOMs, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, or call it once per epoch or "
        "after freeing a large object"
    )
    what_it_flags = (
        "`torch.cuda.empty_cache()` (however `torch` was imported, or `from torch.cuda import empty_cache`) "
        "in code that runs once per training or evaluation step of a CUDA script. Calls under a periodic "
        "guard (`if step % 1000 == 0:`), at epoch level, after the loop, or in an exception handler that "
        "recovers from an out-of-memory error are not flagged."
    )
    why_it_costs = (
        "PyTorch's CUDA caching allocator keeps freed blocks so that the next step's tensors of the same "
        "sizes are served without asking the driver. `empty_cache()` releases every unused cached block "
        "with `cudaFree`, which waits for the device to finish the work that may still use it. The next "
        "step then finds the cache empty and calls `cudaMalloc` again for its activations and "
        "gradients; `cudaMalloc`/`cudaFree` are slow driver calls that synchronize the device, so the "
        "step runs without the CPU-GPU overlap, and the memory freed is not available to the step "
        "anyway (it was reusable before). Memory actually held by tensors is not freed by it."
    )
    example = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    torch.cuda.empty_cache()\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "torch.cuda.empty_cache()  # once, e.g. before evaluation, if another process needs the memory\n"
    )
    fix_safety = (
        "Fixed only with `--unsafe-fixes`, which removes the statement. Removing it does not change "
        "results, only how much reserved memory `nvidia-smi` shows between steps; it is unsafe because a "
        "job that shares its GPU with another process, or that fragments its memory badly, may have "
        "called it on purpose, and only its author knows."
    )
    valid = (
        # Periodic, and once per epoch.
        "import torch\n"
        "for epoch in range(epochs):\n"
        "    for step, (x, y) in enumerate(train_loader):\n"
        "        loss = model(x.cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        if step % 1000 == 0:\n"
        "            torch.cuda.empty_cache()\n"
        "    torch.cuda.empty_cache()\n",
        # Recovering from an out-of-memory error.
        "import torch\n"
        "for x, y in train_loader:\n"
        "    try:\n"
        "        loss = model(x.cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    except torch.cuda.OutOfMemoryError:\n"
        "        optimizer.zero_grad()\n"
        "        torch.cuda.empty_cache()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.cuda import empty_cache\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    torch.cuda.empty_cache()  # expect: LA401\n"
        "    empty_cache()  # expect: LA401\n",
        # Inside a function called once per evaluation step.
        "import torch\n"
        "def predict(model, images):\n"
        "    with torch.no_grad():\n"
        "        out = model(images.cuda())\n"
        "    torch.cuda.empty_cache()  # expect: LA401\n"
        "    return out\n"
        "for images, _ in test_loader:\n"
        "    preds.append(predict(model, images).argmax(1))\n",
    )

    confirmed_by = ("LA604",)
    node_types = (cst.Call,)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if (ctx.qualified_name(node.func) or "") in _EMPTY_CACHE:
            yield Report(node, fix=_removal(node, ctx))


def _removal(call: cst.Call, ctx) -> Fix | None:
    """Remove the statement `torch.cuda.empty_cache()` (a `pass` where it is alone in its block).
    Only a statement of its own: `x = f() or torch.cuda.empty_cache()` is left to the user."""
    for block in iter_subtree(ctx.frame.node or ctx.index.module):
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            continue
        for line in block.body:
            if isinstance(line, cst.SimpleStatementLine) and any(
                isinstance(statement, cst.Expr) and statement.value is call for statement in line.body
            ):
                if len(line.body) > 1:
                    return None  # `a(); torch.cuda.empty_cache()`: rare, left to the user
                if len(block.body) == 1:
                    return Fix(
                        "replace the call with `pass`", ((line, line.with_changes(body=[cst.Pass()])),), safe=False
                    )
                return Fix("remove the call", ((block, _without(block, line)),), safe=False)
    return None


def _without(block, line):
    """`block` without `line`; the comment lines above it stay, above the next statement (or at the
    end of the block)."""
    body = list(block.body)
    index = body.index(line)
    del body[index]
    if index < len(body):
        body[index] = body[index].with_changes(leading_lines=[*line.leading_lines, *body[index].leading_lines])
        return block.with_changes(body=body)
    return block.with_changes(body=body, footer=[*line.leading_lines, *block.footer])
