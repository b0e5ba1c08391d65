from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext, terminal_name


def _is_cpu_device(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """ "cpu", torch.device("cpu"), or a name bound only to one of those (`cpu_device`)."""
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value == "cpu"
    if isinstance(expr, cst.Call) and ctx.qualified_name(expr.func) == "torch.device" and expr.args:
        return _is_cpu_device(expr.args[0].value, ctx, depth)
    if isinstance(expr, cst.Name) and depth < 2:
        found = ctx.scope.lookup(expr.value)
        bindings = found[0] if found else []
        return bool(bindings) and all(b.kind == "value" and _is_cpu_device(b.value, ctx, depth + 1) for b in bindings)
    return False


# Methods that only an `nn.Module` (or a pipeline of them) has: what they are called on is no tensor.
_MODULE_METHODS = frozenset(
    {
        "parameters",
        "named_parameters",
        "modules",
        "named_modules",
        "children",
        "named_children",
        "eval",
        "train",
        "state_dict",
        "load_state_dict",
        "register_forward_hook",
        "register_forward_pre_hook",
        "zero_grad",
        "enable_gradient_checkpointing",
        "gradient_checkpointing_enable",
    }
)
# Calls that hand back the module they are called on (`vae.to(device, dtype=...)`, `model.eval()`).
_RETURNS_ITSELF = frozenset(
    {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "eval", "train", "requires_grad_"}
)
# Calls that make or unwrap a module: `AutoencoderKL.from_pretrained(...)`, `accelerator.unwrap_model(m)`.
_MODULE_MAKERS = frozenset({"from_pretrained", "from_config", "from_single_file", "unwrap_model"})
_TENSOR_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def _is_module(expr: cst.BaseExpression, ctx, scope=None, depth: int = 0) -> bool:
    """Is `expr` an `nn.Module` (or a pipeline of them), whose `.cpu()` moves weights rather than read
    a tensor: made by a class deriving from `nn.Module`, by `from_pretrained`, by `unwrap_model`; or a
    name (`self.x`) whose `.parameters()`, `.eval()`, `.train()` ... the code calls?"""
    scope = ctx.scope if scope is None else scope
    if depth > 4:
        return False
    while (
        isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _RETURNS_ITSELF
    ):
        expr = expr.func.value  # `vae.to(device, dtype=torch.float32)`: the same module
    if isinstance(expr, cst.Call):
        if terminal_name(expr.func) in _MODULE_MAKERS:
            return True
        made = ctx.steps.class_made_by(expr, scope) or ""
        if made.startswith("<local>."):
            cls = ctx.index.classes.get(made[len("<local>.") :])
            return cls is not None and ctx.steps.is_torch_module(cls)
        return made.startswith("torch.nn.") and made not in _TENSOR_CLASSES
    if isinstance(expr, cst.Name):
        found = scope.lookup(expr.value)
        if found is None:
            return False
        bindings, owner = found
        if (id(owner), expr.value) in _module_method_receivers(ctx):
            return True
        if any(
            b.kind == "value"
            and not _refers_to_itself(b.value, expr.value)
            and _is_module(b.value, ctx, b.scope, depth + 1)
            for b in bindings
        ):
            return True
        return expr.value in owner.params and _module_parameter(expr.value, owner, ctx, depth)
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        cls = scope.owner_class
        if cls is None:
            return False
        if (id(cls), "self." + expr.attr.value) in _module_method_receivers(ctx):
            return True
        return any(
            b.kind == "value" and _is_module(b.value, ctx, b.scope, depth + 1)
            for b in cls.attributes.get(expr.attr.value, ())
        )
    return False


def _module_parameter(name: str, owner, ctx, depth: int) -> bool:
    """A parameter annotated `nn.Module`, or one the module's callers fill with a module
    (`compute_text_embeddings(prompt, text_encoding_pipeline)`)."""
    function = ctx.steps.function_info(owner.function) if owner.function is not None else None
    if function is None:
        return False
    param = next(
        (p for p in (*owner.function.params.params, *owner.function.params.kwonly_params) if p.name.value == name), None
    )
    if param is not None and param.annotation is not None:
        annotation = ctx.qualified_name(param.annotation.annotation) or ""
        if annotation in ("torch.nn.Module", "torch.nn.modules.module.Module"):
            return True
    return any(
        argument is not None and _is_module(argument, ctx, scope, depth + 1)
        for argument, scope in ctx.tensors.arguments_for(name, function)
    )


def _refers_to_itself(value: cst.BaseExpression, name: str) -> bool:
    """`vae = vae.to(device)`: a binding that is the name's own earlier value."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    return isinstance(value, cst.Name) and value.value == name


def _module_method_receivers(ctx) -> frozenset:
    return ctx.memoized("module method receivers", lambda: _find_module_method_receivers(ctx))


def _find_module_method_receivers(ctx) -> frozenset:
    """(id(scope), name) for `name.parameters()`, `name.eval()` ... where the name belongs to that
    scope, and (id(class), "self.x") for `self.x.eval()` in a method of the class."""
    found = set()
    for site in ctx.index.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in _MODULE_METHODS):
            continue
        receiver = func.value
        if isinstance(receiver, cst.Name):
            owner = site.scope.lookup(receiver.value)
            if owner is not None:
                found.add((id(owner[1]), receiver.value))
        elif (
            isinstance(receiver, cst.Attribute)
            and isinstance(receiver.value, cst.Name)
            and receiver.value.value == "self"
            and site.scope.owner_class is not None
        ):
            found.add((id(site.scope.owner_class), "self." + receiver.attr.value))
    return frozenset(found)


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword and arg.keyword.value == name), None)


def _is_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


class DeviceToHostCopyInStep(Rule):
    code = "LA102"
    name = "device-to-host-copy-in-step"
    summary = '`.cpu()`, `.to("cpu")` or `.numpy(force=True)` of a tensor once per step.'
    message = "`.cpu()` waits for the GPU and copies to pageable host memory: the CPU stalls until the GPU drains, once per step"
    suggestion = (
        "keep per-step results on the device (append the tensor, or accumulate it) and move them to the "
        "host once, after the loop or at the log interval; if you need the copy every step, use "
        "`.to('cpu', non_blocking=True)` into pinned memory and read it a step later"
    )
    what_it_flags = (
        "A device-to-host copy of a tensor in code that runs once per step of a CUDA script: `.cpu()`, "
        '`.to("cpu")`, `.to(device="cpu")`, `.to(torch.device("cpu"))` and `.numpy(force=True)`, '
        "typically in `preds.append(out.argmax(1).cpu().numpy())`. A line with both `.cpu()` and "
        "`.numpy()` is one finding. A plain `.numpy()` is not flagged: on a CUDA tensor it raises, so in a "
        "working script it reads a tensor that is already on the host (the copy that put it there is the "
        "finding). Copies with `non_blocking=True` are not flagged, nor are copies in a branch only a CPU run "
        'takes (`if mode == "cpu":`, `if not torch.cuda.is_available():`). Nor is moving a whole module '
        'to the host to free GPU memory (`vae.cpu()`, `pipeline.to("cpu")` under an offload option), '
        "which reads no tensor's value: a receiver made by a class deriving from `nn.Module`, by "
        "`from_pretrained` or `unwrap_model`, or one whose `.parameters()`, `.eval()`, `.train()` (or "
        "another method only a module has) the code calls."
    )
    why_it_costs = (
        "A blocking device-to-host copy is queued behind every kernel already launched, and the CPU waits "
        "for it (`Memcpy DtoH` and `cudaStreamSynchronize` in a profile). Once per step, the GPU's queue "
        "drains every step, and the copy into pageable memory goes through a staging buffer."
    )
    example = (
        "for images, labels in val_loader:\n"
        "    logits = model(images.cuda())\n"
        "    all_preds.append(logits.argmax(1).cpu().numpy())\n"
    )
    use_instead = (
        "for images, labels in val_loader:\n"
        "    logits = model(images.cuda())\n"
        "    all_preds.append(logits.argmax(1))\n"
        "all_preds = torch.cat(all_preds).cpu().numpy()  # one copy, after the loop\n"
    )
    fix_safety = "No automatic fix: what the host code does with the values decides where the copy can go."
    valid = (
        # A branch that only a CPU run takes (YOLOX's fallback after running out of GPU memory).
        "import torch\n"
        "def assign(boxes, preds, mode='gpu'):\n"
        "    if mode == 'cpu':\n"
        "        boxes, preds = boxes.cpu().float(), preds.cpu().float()\n"
        "    return match(boxes, preds)\n"
        "model = Net().cuda()\n"
        "for x, boxes in train_loader:\n"
        "    preds = model(x.cuda(non_blocking=True))\n"
        "    loss = assign(boxes.cuda(non_blocking=True), preds).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, after the loop.
        "import torch\n"
        "preds = []\n"
        "for x, y in val_loader:\n"
        "    preds.append(model(x.cuda()).argmax(1))\n"
        "preds = torch.cat(preds).cpu().numpy()\n",
        # A non-blocking copy does not stall the host.
        "import torch\n"
        "for x, y in val_loader:\n"
        "    out = model(x.cuda())\n"
        "    host = out.to('cpu', non_blocking=True)\n",
        # A plain .numpy() reads a host tensor (on a CUDA tensor it would raise).
        "import torch\n"
        "model.cuda()\n"
        "for x, y in loader:\n"
        "    histogram.update(y.numpy())\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Offloading a module moves its weights; it reads no tensor (diffusers' `--offload`).
        "import torch\n"
        "from diffusers import AutoencoderKL\n"
        "vae = AutoencoderKL.from_pretrained(path, subfolder='vae')\n"
        "class Head(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x\n"
        "head = Head().cuda()\n"
        "def encode_prompt(text_encoder, ids):\n"
        "    text_encoder.eval()\n"
        "    embeds = text_encoder(ids.to('cuda'))[0]\n"
        "    text_encoder.to('cpu')\n"
        "    return embeds\n"
        "for step, batch in enumerate(train_dataloader):\n"
        "    latents = vae.to('cuda').encode(batch['pixel_values'].to('cuda')).latent_dist.sample()\n"
        "    if args.offload:\n"
        "        vae.cpu()\n"
        "        head.to('cpu')\n"
        "    loss = model(latents, encode_prompt(text_encoder, batch['ids'])).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # A conversion helper called once per step: its `return` ends the call, not the loop.
        "import numpy as np\n"
        "import torch\n"
        "def tonumpy(data):\n"
        "    if isinstance(data, np.ndarray):\n"
        "        return data\n"
        "    if isinstance(data, torch.Tensor):\n"
        "        return data.detach().cpu().numpy()  # expect: LA102\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(tonumpy(loss))\n",
        "import torch\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "for images, labels in val_loader:\n"
        "    logits = model(images.to(device))\n"
        "    all_preds.append(logits.argmax(1).cpu().numpy())  # expect: LA102\n"
        "    all_probs.append(logits.softmax(1).to('cpu'))  # expect: LA102\n"
        "    feats.append(logits.to(torch.device('cpu')))  # expect: LA102\n"
        "    raw.append(logits.numpy(force=True))  # expect: LA102\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.Call,)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        receiver = ctx.method_call(node, "cpu")
        if receiver is not None:
            if ctx.maybe_tensor(receiver) and not _is_module(receiver, ctx):
                yield Report(
                    node,
                    f"`{ctx.source(node)}` waits for the GPU and copies to pageable host memory: the CPU stalls until the GPU drains, once per step",
                )
            return
        receiver = ctx.method_call(node, "to")
        if receiver is not None:
            target = node.args[0].value if node.args and node.args[0].keyword is None else _keyword(node, "device")
            if (
                target is not None
                and _is_cpu_device(target, ctx)
                and not _is_true(_keyword(node, "non_blocking"))
                and ctx.maybe_tensor(receiver)
                and not _is_module(receiver, ctx)
            ):
                yield Report(
                    node,
                    f"`{ctx.source(node)}` waits for the GPU and copies to the host: the CPU stalls until the GPU drains, once per step",
                )
            return
        receiver = ctx.method_call(node, "numpy")
        if receiver is not None and _is_true(_keyword(node, "force")) and ctx.maybe_tensor(receiver):
            yield Report(
                node,
                "`.numpy(force=True)` copies a GPU tensor to the host: the CPU stalls until the GPU drains, once per step",
            )
