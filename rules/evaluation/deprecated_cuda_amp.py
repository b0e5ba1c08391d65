from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Fix, Report, Rule, RuleContext, with_first_argument

# What each deprecated name is replaced by; the `torch.cuda.amp` classes are thin subclasses of these.
_REPLACEMENTS = {
    "torch.cuda.amp.autocast": "torch.amp.autocast",
    "torch.cuda.amp.autocast_mode.autocast": "torch.amp.autocast",
    "torch.cuda.amp.GradScaler": "torch.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler": "torch.amp.GradScaler",
}


class DeprecatedCudaAmp(Rule):
    code = "LA502"
    name = "deprecated-cuda-amp"
    summary = "`torch.cuda.amp.autocast` / `torch.cuda.amp.GradScaler`: deprecated, warn on every use."
    message = "`torch.cuda.amp` is deprecated since PyTorch 2.4 and emits a FutureWarning"
    suggestion = 'use `torch.amp.autocast("cuda", ...)` and `torch.amp.GradScaler("cuda", ...)`'
    what_it_flags = (
        "Calls of `torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)`, however they are "
        "imported (`from torch.cuda.amp import autocast, GradScaler`, `from torch.cuda import amp`, "
        "`import torch.cuda.amp as amp`), including `@torch.cuda.amp.autocast()` used as a decorator. "
        "Anywhere in the file, on any device. `torch.amp.autocast`, `torch.autocast` and "
        "`torch.amp.GradScaler` are not flagged."
    )
    why_it_costs = (
        "Since PyTorch 2.4 both names are wrappers marked `@deprecated(..., category=FutureWarning)`: "
        "constructing one emits `FutureWarning: torch.cuda.amp.autocast(args...) is deprecated. Please use "
        'torch.amp.autocast("cuda", args...) instead.` An autocast context built once per step goes '
        "through the warnings machinery every step (Python prints it once per call site, but still looks it "
        "up), the log fills with warnings that hide real ones, and a run with `-W error` or "
        "`filterwarnings = error` (common in test suites) fails. The deprecated names are slated for "
        "removal; the device-generic `torch.amp` API is the same code with the device type as an argument."
    )
    example = (
        "from torch.cuda.amp import GradScaler, autocast\n"
        "scaler = GradScaler()\n"
        "for x, y in loader:\n"
        "    with autocast():\n"
        "        loss = criterion(model(x), y)\n"
        "    scaler.scale(loss).backward()\n"
    )
    use_instead = (
        "import torch\n"
        'scaler = torch.amp.GradScaler("cuda")\n'
        "for x, y in loader:\n"
        '    with torch.amp.autocast("cuda"):\n'
        "        loss = criterion(model(x), y)\n"
        "    scaler.scale(loss).backward()\n"
    )
    fix_safety = (
        "Fixed by `--fix` (safe) where the call is written out (`torch.cuda.amp.autocast(...)`, any alias "
        'of torch): it becomes `torch.amp.autocast("cuda", ...)`. Calls through names imported from '
        "`torch.cuda.amp`, and autocast calls with positional arguments, are left to you. Safe to rewrite by hand: `torch.cuda.amp.autocast(args...)` is defined as "
        '`torch.amp.autocast("cuda", args...)` and `torch.cuda.amp.GradScaler(args...)` as '
        '`torch.amp.GradScaler("cuda", args...)`. Code that must run on PyTorch older than 2.3 (where '
        "`torch.amp.GradScaler` does not exist) should keep a version check."
    )
    valid = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "for x, y in train_loader:\n"
        "    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
        "        loss = criterion(model(x.cuda()), y.cuda())\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n",
        # The generic names imported from torch.amp are fine.
        "import torch\n"
        "from torch.amp import GradScaler, autocast\n"
        "scaler = GradScaler('cuda')\n"
        "with autocast(device_type='cuda'):\n"
        "    out = model(x)\n",
    )
    invalid = (
        # Through a module-level alias, with a stand-in class for old versions (RAFT).
        "import torch\n"
        "try:\n"
        "    autocast = torch.cuda.amp.autocast\n"
        "except AttributeError:\n"
        "    class autocast:\n"
        "        def __init__(self, enabled):\n"
        "            pass\n"
        "class RAFT(torch.nn.Module):\n"
        "    def forward(self, image1, image2):\n"
        "        with autocast(enabled=True):  # expect: LA502\n"
        "            return self.fnet([image1, image2])\n",
        "import torch\n"
        "from torch.cuda.amp import GradScaler, autocast\n"
        "scaler = GradScaler()  # expect: LA502\n"
        "for x, y in train_loader:\n"
        "    with autocast():  # expect: LA502\n"
        "        loss = criterion(model(x.cuda()), y.cuda())\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n",
        # Full paths, a module alias, and a decorator.
        "import torch\n"
        "from torch.cuda import amp\n"
        "scaler = torch.cuda.amp.GradScaler(enabled=True)  # expect: LA502\n"
        "class Net(torch.nn.Module):\n"
        "    @amp.autocast()  # expect: LA502\n"
        "    def forward(self, x):\n"
        "        return self.fc(x)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(Net()(x.cuda()), y.cuda())\n"
        "    scaler.scale(loss).backward()\n",
    )

    node_types = (cst.Call,)
    needs_step = False
    needs_cuda = False
    text_hint = r"cuda\.amp\b|from\s+torch\.cuda\s+import[^\n]*\bamp\b"

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        qualified = ctx.qualified_name(node.func)
        replacement = _REPLACEMENTS.get(qualified or "")
        if replacement is None:
            return
        written = ctx.source(node.func)
        what = f"`{written}`" if written == qualified else f"`{written}` (`{qualified}`)"
        yield Report(
            node,
            f'{what} is deprecated and emits a FutureWarning since PyTorch 2.4: use `{replacement}("cuda", ...)`',
            fix=_fix(node, replacement),
        )


def _fix(call: cst.Call, replacement: str) -> Fix | None:
    """`torch.cuda.amp.X(...)` written out in full (any alias of torch) becomes `torch.amp.X("cuda", ...)`.
    Names imported from torch.cuda.amp are left alone (the import would need rewriting too), and so is
    an autocast with positional arguments (its second parameter is `dtype` in torch.amp, `enabled` in
    torch.cuda.amp)."""
    func = call.func
    if not (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Attribute)
        and func.value.attr.value == "amp"
        and isinstance(func.value.value, cst.Attribute)
        and func.value.value.attr.value == "cuda"
    ):
        return None
    name = replacement.rsplit(".", 1)[1]
    if name == "autocast" and any(arg.keyword is None for arg in call.args):
        return None
    torch_root = func.value.value.value
    new_func = cst.Attribute(value=cst.Attribute(value=torch_root, attr=cst.Name("amp")), attr=cst.Name(name))
    new_call = with_first_argument(call.with_changes(func=new_func), cst.SimpleString('"cuda"'))
    return Fix(f'use `{replacement}("cuda", ...)`', ((call, new_call),))
