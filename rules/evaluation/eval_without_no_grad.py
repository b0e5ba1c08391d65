from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from loopaudit.rule_api import (
    EVALUATION_FUNCTION,
    FORWARD_CALLEE,
    FrameKind,
    Group,
    Kind,
    Report,
    Rule,
    RuleContext,
    is_inference_method,
    is_training_call,
    iter_subtree,
    runs_a_model,
    terminal_name,
)

# Callees that compute a loss or metric from outputs rather than run the model.
_NOT_A_MODEL = re.compile(r"(?i)criterion|loss|metric")


class EvalWithoutNoGrad(Rule):
    code = "LA501"
    name = "eval-without-no-grad"
    summary = "An evaluation loop running forward passes with autograd on (no `torch.no_grad()`)."
    message = "this evaluation loop runs forward passes with autograd recording: wrap it in `torch.no_grad()`"
    suggestion = (
        "wrap the loop in `with torch.inference_mode():` (or `torch.no_grad()`), or decorate the "
        "evaluation function with `@torch.no_grad()`"
    )
    what_it_flags = (
        "A loop over batches that runs the model (`model(x)`, `self.net(x)`) and does not train, when it "
        "evaluates: the model was put in eval mode before it in the same function (`model.eval()`, "
        "`model.train(False)`), or the function is named like an evaluation (`evaluate`, `validate`, `test`, "
        "`eval_epoch`, `run_validation`, `estimate_loss`), and the forward passes are not under "
        "`torch.no_grad()`, `torch.inference_mode()` or `torch.set_grad_enabled(False)`: as a `with`, as a "
        "decorator, or around every call of the function in the module. Reported at the forward passes, "
        "where the graph is recorded: one finding at the first, with the loop's other forward passes "
        "(nested loops included) listed beside it. Also flagged, outside any loop, in a function that runs "
        "once per step: a forward pass after `.eval()` when the function trained before it and trains no "
        "more (pygcn's `train(epoch)` validating after its update); one in a function named like an "
        "evaluation; and one in a function that trains nowhere, stores nothing, and hands back only "
        "NumPy arrays, Python values or host tensors (an agent's `select_action(state)` returning "
        "`self.actor(state).cpu().numpy()`), whose graph is thrown away as soon as it is built. "
        "Not flagged: loops that call `backward()`, `optimizer.step()` or `torch.autograd.grad` (attacks, "
        "saliency, test-time training need gradients), loops that set `requires_grad`, and framework hooks "
        "(Lightning's `validation_step`, `test_step`, HF `prediction_step`), which the framework already "
        "runs under `no_grad`. Any device."
    )
    why_it_costs = (
        "`model.eval()` only switches dropout and batch norm to inference behaviour; it does not turn "
        "autograd off. With grad mode on, every operation on a parameter records a node in the autograd "
        "graph and saves the tensors its backward would need (activations, inputs of matmuls and "
        "convolutions), for a backward that never comes. That memory stays allocated until the output is "
        "freed, so evaluation needs about as much activation memory as training (a batch size that trains "
        "can run out of memory in validation), and each op pays the recording overhead. Under "
        "`torch.no_grad()` nothing is recorded or saved; `torch.inference_mode()` also skips version "
        "counter and view tracking. And an output accumulated across the loop (`preds.append(out)`) keeps "
        "each batch's whole graph alive."
    )
    example = (
        "def evaluate(model, val_loader):\n"
        "    model.eval()\n"
        "    correct = 0\n"
        "    for x, y in val_loader:\n"
        "        correct += (model(x).argmax(1) == y).sum()\n"
        "    return correct\n"
    )
    use_instead = (
        "@torch.inference_mode()\n"
        "def evaluate(model, val_loader):\n"
        "    model.eval()\n"
        "    correct = 0\n"
        "    for x, y in val_loader:\n"
        "        correct += (model(x).argmax(1) == y).sum()\n"
        "    return correct\n"
    )
    fix_safety = (
        "Safe when the loop needs no gradients, which holds for loops this rule flags (they call no "
        "backward). Prefer `torch.no_grad()` to `inference_mode()` when tensors created in the loop are "
        "later used in autograd (inference tensors cannot be)."
    )
    valid = (
        # Decorated, or wrapped in a `with`, or run from a caller under no_grad.
        "import torch\n"
        "@torch.no_grad()\n"
        "def evaluate(model, val_loader):\n"
        "    model.eval()\n"
        "    for x, y in val_loader:\n"
        "        out = model(x.cuda())\n"
        "def test(model, test_loader):\n"
        "    model.eval()\n"
        "    with torch.inference_mode():\n"
        "        for x, y in test_loader:\n"
        "            out = model(x.cuda())\n"
        "def validate(model, val_loader):\n"
        "    for x, y in val_loader:\n"
        "        out = model(x.cuda())\n"
        "with torch.no_grad():\n"
        "    validate(model, val_loader)\n",
        # A training loop, and a test that needs gradients (an adversarial attack).
        "import torch\n"
        "def test(model, test_loader, epsilon):\n"
        "    model.eval()\n"
        "    for data, target in test_loader:\n"
        "        data.requires_grad = True\n"
        "        loss = criterion(model(data.cuda()), target.cuda())\n"
        "        loss.backward()\n"
        "model.train()\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Train then validate in one per-step function, the validation under no_grad; and a model
        # put in eval mode (to freeze its batch norm) whose forward a later backward uses.
        "import torch\n"
        "model = GCN().cuda()\n"
        "def train(epoch):\n"
        "    output = model(features, adj)\n"
        "    loss_fn(output[idx_train], labels[idx_train]).backward()\n"
        "    optimizer.step()\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        output = model(features, adj)\n"
        "def finetune(epoch):\n"
        "    optimizer.step()\n"
        "    model.eval()\n"
        "    output = model(features, adj)\n"
        "    loss_fn(output, labels).backward()\n"
        "for epoch in range(200):\n"
        "    train(epoch)\n"
        "    finetune(epoch)\n",
        # An agent that keeps the policy's output for a later backward (A2C's rollout), and one that
        # acts under no_grad.
        "import torch\n"
        "class Agent:\n"
        "    def __init__(self):\n"
        "        self.actor = Actor().cuda()\n"
        "        self.log_probs = []\n"
        "    def act(self, obs):\n"
        "        dist = self.actor(torch.as_tensor(obs, device='cuda'))\n"
        "        action = dist.sample()\n"
        "        self.log_probs.append(dist.log_prob(action))\n"
        "        return action.cpu().numpy()\n"
        "    @torch.no_grad()\n"
        "    def greedy(self, obs):\n"
        "        return self.actor(torch.as_tensor(obs, device='cuda')).mean.cpu().numpy()\n"
        "    def update(self, returns):\n"
        "        loss = -(torch.stack(self.log_probs) * returns).sum()\n"
        "        loss.backward()\n"
        "agent = Agent()\n"
        "for step in range(1000):\n"
        "    obs, reward, done, _ = env.step(agent.act(obs))\n"
        "    env.step(agent.greedy(obs))\n"
        "    agent.update(reward)\n",
        # PPO's `evaluate(states, actions)` scores stored actions for the loss its caller backpropagates.
        "import torch\n"
        "class ActorCritic(torch.nn.Module):\n"
        "    def evaluate(self, state, action):\n"
        "        dist = Categorical(self.actor(state))\n"
        "        return dist.log_prob(action), self.critic(state), dist.entropy()\n"
        "class PPO:\n"
        "    def __init__(self):\n"
        "        self.policy = ActorCritic().cuda()\n"
        "    def update(self, states, actions, advantages):\n"
        "        for _ in range(80):\n"
        "            logprobs, values, entropy = self.policy.evaluate(states, actions)\n"
        "            loss = -(logprobs * advantages).mean() - 0.01 * entropy.mean()\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n"
        "ppo = PPO()\n"
        "for episode in range(1000):\n"
        "    ppo.update(*buffer.sample())\n",
        # A base class's method calls, under no_grad, an evaluation only its subclass defines (XLM).
        "import torch\n"
        "class Evaluator:\n"
        "    def run_all_evals(self):\n"
        "        with torch.no_grad():\n"
        "            self.evaluate_mt('valid')\n"
        "class EncDecEvaluator(Evaluator):\n"
        "    def evaluate_mt(self, data_set):\n"
        "        for x, y in self.get_iterator(data_set):\n"
        "            scores = self.decoder(self.encoder(x.cuda()))\n"
        "            loss = criterion(scores, y.cuda())\n"
        "evaluator = EncDecEvaluator()\n"
        "for epoch in range(10):\n"
        "    evaluator.run_all_evals()\n",
        # Lightning runs validation_step under no_grad itself.
        "import torch\n"
        "import lightning as L\n"
        "class Lit(L.LightningModule):\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        for x in batch:\n"
        "            self.model(x)\n",
    )
    invalid = (
        "import torch\n"
        "device = torch.device('cuda')\n"
        "def evaluate(model, val_loader):\n"
        "    model.eval()\n"
        "    correct = 0\n"
        "    for images, labels in val_loader:\n"
        "        outputs = model(images.to(device))  # expect: LA501\n"
        "        correct += (outputs.argmax(1) == labels.to(device)).sum()\n"
        "    return correct\n",
        # After model.eval() in the training script, the validation loop records a graph.
        "import torch\n"
        "for epoch in range(10):\n"
        "    model.train()\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.cuda()), y.cuda())\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    model.eval()\n"
        "    for x, y in val_loader:\n"
        "        val_loss = criterion(model(x.cuda()), y.cuda())  # expect: LA501\n",
        # Two forward passes, one in a nested loop over crops: one finding, the second pass listed.
        "import torch\n"
        "def validate(model, val_loader):\n"
        "    model.eval()\n"
        "    for images, labels in val_loader:\n"
        "        outputs = model(images.cuda())  # expect: LA501\n"
        "        for crop in images.unbind(1):\n"
        "            outputs = outputs + model(crop.cuda())  # related: LA501\n",
        # pygcn's full-batch step: train, then `model.eval()` and run the model on the validation nodes.
        "import torch\n"
        "model = GCN().cuda()\n"
        "def train(epoch):\n"
        "    model.train()\n"
        "    output = model(features, adj)\n"
        "    loss_fn(output[idx_train], labels[idx_train]).backward()\n"
        "    optimizer.step()\n"
        "    model.eval()\n"
        "    output = model(features, adj)  # expect: LA501\n"
        "    loss_val = loss_fn(output[idx_val], labels[idx_val])\n"
        "for epoch in range(200):\n"
        "    train(epoch)\n",
        # An agent's action, handed back as a NumPy array: the graph of every step is thrown away.
        "import torch\n"
        "class TD3:\n"
        "    def __init__(self):\n"
        "        self.actor = Actor().cuda()\n"
        "    def select_action(self, state):\n"
        "        state = torch.FloatTensor(state.reshape(1, -1)).cuda()\n"
        "        return self.actor(state).cpu().data.numpy().flatten()  # expect: LA501\n"
        "    def train(self, batch):\n"
        "        loss = self.actor(batch).mean()\n"
        "        loss.backward()\n"
        "policy = TD3()\n"
        "for t in range(1000):\n"
        "    action = policy.select_action(state)\n"
        "    state, reward, done, _ = env.step(action)\n"
        "    policy.train(replay_buffer.sample())\n",
        # A walk over users in an evaluation function, running the model's `predict` (SASRec).
        "import torch\n"
        "import numpy as np\n"
        "model = SASRec().cuda()\n"
        "def evaluate(model, users):\n"
        "    for u in users:\n"
        "        scores = model.predict(np.array([u]), np.array(history[u]))  # expect: LA501\n"
        "        ranks.append(scores.argsort()[0])\n"
        "for epoch in range(200):\n"
        "    for x, y in loader:\n"
        "        model(x.cuda(non_blocking=True)).mean().backward()\n"
        "        optimizer.step()\n"
        "    evaluate(model, users)\n",
    )

    node_types = (cst.For, cst.While, cst.Call)
    needs_step = False
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if isinstance(node, cst.Call):
            yield from _evaluation_in_step(node, ctx)
            return
        loop = ctx.index.loops_by_node.get(id(node))
        if loop is None:
            return
        why = _evaluates(loop, ctx)
        if why is None or _outer_evaluation(loop, ctx):
            return  # an enclosing evaluation loop reports the forward passes of this one
        recording = [site for site in _forwards(loop, ctx) if not ctx.steps.under_no_grad(site.frame)]
        if not recording:
            return
        # Reported at the forward passes, where the graph is recorded (and where people who label
        # training code put this problem), as one finding: one `no_grad` around the loop fixes them all.
        group = Group(
            id(loop.node),
            noun="forward pass",
            where="in this evaluation loop",
            advice="wrap the loop in `torch.no_grad()`",
        )
        for site in recording:
            yield Report(
                site.call,
                f"this forward pass in an evaluation loop ({why}) records an autograd graph: it saves "
                f"activations for a backward that never comes; wrap the loop in `torch.no_grad()` / "
                f"`torch.inference_mode()`",
                group=group,
            )


def _evaluation_in_step(call: cst.Call, ctx):
    """A forward pass outside any loop, in a function that runs once per step and evaluates there:
    pyGAT's and pygcn's `train(epoch)` trains, then `model.eval()` and runs the model again on the
    validation nodes; an `eval_step(state)` called per step of an evaluation episode. The graph that
    forward records is never used when no training follows it in the function."""
    if not _is_forward(call, ctx):
        return
    frame = ctx.frame
    while frame is not None and frame.kind is not FrameKind.FUNCTION:
        if frame.kind is FrameKind.LOOP:
            return  # a loop's forward passes are the loop's (see `check`)
        frame = frame.parent
    function = frame.function if frame is not None else None
    if function is None or _in_framework_code(function, ctx):
        return
    named = EVALUATION_FUNCTION.match(function.name) is not None and not _feeds_training(function, ctx)
    before, after = _training_around(call, function.node, ctx)
    # An agent's `act(obs)`: the output leaves autograd at once, handed back as NumPy or Python values.
    acts = not before and not after and _hands_back_host_values(function, ctx) and _keeps_nothing(function.node)
    if after or not (named or acts or (before and _after_eval_mode(call, function.node, ctx))):
        return  # a forward whose graph a later backward uses, or a model merely switched to eval mode
    if ctx.steps.reason(ctx.frame) is None or ctx.steps.under_no_grad(ctx.frame):
        return
    if _grad_disabled_by_call(function.node, ctx) or _sets_requires_grad(function.node):
        return
    if named:
        why = f"`{function.name}()`"
    elif acts:
        why = f"`{function.name}()` hands back host values, so the graph is thrown away"
    else:
        why = "after `.eval()`, after the step's update"
    yield Report(
        call,
        f"this forward pass evaluates once per step ({why}) with autograd recording: it saves activations "
        f"for a backward that never comes; run it under `torch.no_grad()` / `torch.inference_mode()`",
        group=Group(
            id(function.node),
            noun="forward pass",
            where=f"in `{function.name}()`",
            advice="run them under one `torch.no_grad()`",
        ),
    )


def _training_around(call: cst.Call, root, ctx) -> tuple[bool, bool]:
    """(whether `root` trains before `call`, whether it trains after it), in source order; nested
    functions' bodies run elsewhere and are skipped."""
    before = after = seen = False
    for n in iter_subtree(root):
        if n is call:
            seen = True
        elif isinstance(n, cst.Call) and is_training_call(n, ctx.index.imports):
            if seen:
                after = True
            else:
                before = True
    return before, after


def _feeds_training(function, ctx) -> bool:
    """Is what the function computes trained on: a caller keeps its result and backpropagates after
    it, on every pass? PPO's `ActorCritic.evaluate(states, actions)` scores the stored actions for
    the policy loss; the name says evaluate, the caller's `loss.backward()` says training. (An
    `evaluate()` under `if step % N == 0:` before the step's backward is still an evaluation.)"""
    for site in function.call_sites[:8]:
        caller = site.scope.function
        if caller is None or not _result_kept(site) or _guarded(site.frame):
            continue
        if _training_around(site.call, caller, ctx)[1]:
            return True
    return False


def _result_kept(site) -> bool:
    """Is the call's result bound to a name (`logprobs, values, entropy = policy.evaluate(...)`)?"""
    return any(b.value is site.call for bindings in site.scope.assignments.values() for b in bindings)


def _guarded(frame) -> bool:
    """Does the code at `frame` run only now and then, or only on some arm (up to its function)?"""
    while frame is not None and frame.kind is not FrameKind.FUNCTION:
        if frame.kind in (FrameKind.PERIODIC, FrameKind.RARE, FrameKind.DEFERRED):
            return True
        frame = frame.parent
    return False


def _hands_back_host_values(function, ctx) -> bool:
    """Does every `return` give back what a host conversion made: `return self.actor(s).cpu().numpy()`,
    `return to_np(action[0])`, or a name bound only to such values?"""
    return bool(function.returns) and all(_host_value(value, function, ctx, True) for value in function.returns)


# Methods that turn a tensor into NumPy or Python values, or copy it to the host.
_TO_HOST = frozenset({"numpy", "item", "tolist", "cpu"})


def _host_value(value, function, ctx, follow_names: bool) -> bool:
    if isinstance(value, cst.Name) and follow_names:
        found = function.scope.lookup(value.value)
        bindings = found[0] if found and found[1] is function.scope else []
        return bool(bindings) and all(
            b.kind == "value" and _host_value(b.value, function, ctx, False) for b in bindings
        )
    inner = value
    while isinstance(inner, (cst.Call, cst.Attribute, cst.Subscript)):
        if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in _TO_HOST:
            return True
        inner = inner.func if isinstance(inner, cst.Call) else inner.value
    # A helper that converts what it is given (`to_np(action[0])`): a tensor in, no tensor out. Not a
    # class built from tensors (`utils.TruncatedNormal(mu, std)`): the object holds them.
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, (cst.Name, cst.Attribute))
        and bool(value.args)
        and not (terminal_name(value.func) or "")[:1].isupper()
        and ctx.tensors.kind(value, function.scope) in (Kind.NOT_TENSOR, Kind.HOST_TENSOR)
        and ctx.tensors.kind(value.args[0].value, function.scope) is Kind.TENSOR
    )


# Methods that keep what they are given: a forward's output stored for a later backward (A2C's
# `self.log_probs.append(dist.log_prob(action))`) is not thrown away.
_KEEPING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "put", "push", "store", "add_"})


def _keeps_nothing(root) -> bool:
    """The function stores nothing in an attribute, an element or a container."""
    for n in iter_subtree(root):
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            if any(isinstance(t, (cst.Attribute, cst.Subscript)) for t in targets):
                return False
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in _KEEPING_METHODS:
            return False
    return True


def _sets_requires_grad(root) -> bool:
    """Does the code touch `requires_grad` or `.grad` (an attack or saliency map needs gradients)?"""
    return any(
        isinstance(n, cst.Attribute) and n.attr.value in ("requires_grad", "requires_grad_", "grad")
        for n in iter_subtree(root)
    )


def _evaluates(loop, ctx) -> str | None:
    """Why `loop` is an evaluation loop that runs the model with autograd on (`validate()`, after
    `.eval()`), or None when it is not one."""
    if not ctx.steps.is_step_loop(loop):
        return None
    function = loop.function
    if function is not None and _in_framework_code(function, ctx):
        return None
    root = function.node if function else ctx.index.module
    named = (
        function is not None
        and EVALUATION_FUNCTION.match(function.name) is not None
        and not _feeds_training(function, ctx)
    )
    if not named and not _after_eval_mode(loop.node, root, ctx):
        return None
    if not _forwards(loop, ctx) or _needs_gradients(loop, ctx) or _grad_disabled_by_call(root, ctx):
        return None
    return f"`{function.name}()`" if named else "after `.eval()`"


def _outer_evaluation(loop, ctx) -> bool:
    outer = loop.parent_loop
    while outer is not None:
        if _evaluates(outer, ctx) is not None:
            return True
        outer = outer.parent_loop
    return False


def _forwards(loop, ctx) -> list:
    return [site for site in loop.all_calls if _is_forward(site.call, ctx)]


def _in_framework_code(function, ctx) -> bool:
    """A method of a Lightning module or HF Trainer, or a function only such methods call."""
    cls = function.class_info
    if cls is not None and ctx.steps.framework_of(cls) is not None:
        return True
    return ctx.steps.hook_name(function) is not None


def _is_forward(call: cst.Call, ctx) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and (
        is_inference_method(func.attr.value) or func.attr.value.startswith("forward_")
    ):
        # `model.predict(u, seq)`, `self.netG.inference(label)`, `self.__S__.forward_lip(x)`: a model's
        # inference method
        return (
            runs_a_model(call)
            and not _NOT_A_MODEL.search(terminal_name(func.value) or "")
            and not ctx.qualified_name(func)
        )
    if isinstance(func, cst.Name):
        name = func.value
    elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
        name = func.attr.value
    else:
        return False
    if name in ctx.index.classes or name == "self" or _NOT_A_MODEL.search(name) or ctx.qualified_name(func):
        return False
    return bool(FORWARD_CALLEE.search(name))


def _needs_gradients(loop, ctx) -> bool:
    for site in loop.all_calls:
        call = site.call
        if is_training_call(call, ctx.index.imports):
            return True
        qualified = ctx.qualified_name(call.func) or ""
        if qualified in ("torch.autograd.grad", "torch.autograd.backward", "torch.enable_grad", "torch.func.grad"):
            return True
        if terminal_name(call.func) in ("requires_grad_", "enable_grad"):
            return True
        for function in ctx.steps.resolve(site):
            if ctx.steps.trains(function) or ctx.steps.has_step_loop(function):
                return True
    return _sets_requires_grad(loop.node)


def _grad_disabled_by_call(root, ctx) -> bool:
    """`torch.set_grad_enabled(False)` called as a statement in the function (or module)."""
    for n in iter_subtree(root):
        if isinstance(n, cst.Call):
            qualified = ctx.qualified_name(n.func) or ""
            if qualified in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled") and n.args:
                value = n.args[0].value
                if isinstance(value, cst.Name) and value.value == "False":
                    return True
    return False


def _after_eval_mode(loop_node, root, ctx) -> bool:
    """Is the last mode switch before the loop, in source order in the same function, `.eval()`?"""
    mode = None
    for n in iter_subtree(root):
        if n is loop_node:
            return mode == "eval"
        if isinstance(n, cst.FunctionDef) and n is not root:
            continue  # a nested function's body runs elsewhere (iter_subtree still descends; harmless)
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute):
            method = n.func.attr.value
            if method == "eval" and not n.args:
                mode = "eval"
            elif method == "train":
                first = n.args[0].value if n.args else None
                if isinstance(first, cst.Name) and first.value == "False":
                    mode = "eval"
                elif first is None or (isinstance(first, cst.Name) and first.value == "True"):
                    mode = "train"
                else:
                    mode = None  # `model.train(phase == "train")`: either
    return False
