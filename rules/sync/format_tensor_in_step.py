from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext, terminal_name

_LOGGER_NAME = re.compile(r"(?i)^(log|logger|_logger|logging|LOGGER|_log)$|_logger$")
# `logger.debug("%s", t)` formats its arguments only when debug logging is on, which it seldom is in
# training; the levels below are on by default. (An f-string argument is formatted regardless, and
# is reported as an f-string.)
_LOG_METHODS = frozenset({"info", "warning", "warn", "error", "critical", "exception", "log"})
_FORMATTING_BUILTINS = frozenset({"print", "str", "repr", "format"})
_STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


def _is_string_expression(expr: cst.BaseExpression) -> bool:
    """A string literal, or one built from literals: `'%10s' * 2 + '%10.4g' * 6`."""
    if isinstance(expr, _STRINGS):
        return True
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Multiply)):
        return _is_string_expression(expr.left) or _is_string_expression(expr.right)
    return False


def _dict_values(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.Dict):
        return [element.value for element in expr.elements if isinstance(element, cst.DictElement)]
    return [expr]


def _positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [arg.value for arg in call.args if arg.keyword is None and not arg.star]


class FormatTensorInStep(Rule):
    code = "LA104"
    name = "format-tensor-in-step"
    summary = "Printing, formatting or logging a tensor once per step."
    message = "formatting a tensor reads its value on the host: the CPU stalls until the GPU drains, once per step"
    suggestion = (
        "log at an interval (`if step % log_interval == 0:`), and log `loss.item()` there, or keep a "
        "device-side running sum and print it then"
    )
    what_it_flags = (
        "A CUDA tensor turned into text in code that runs once per step: `print(loss)`, `str(t)`, "
        'f-strings (`f"{loss:.3f}"`), `"%f" % loss`, `"{}".format(loss)`, `logging`/`logger` calls '
        "with a tensor argument (except `debug`, which formats only when debug logging is on), progress bars given a tensor (`pbar.set_postfix(loss=loss)`), "
        "TensorBoard's `writer.add_scalar(tag, loss, step)` and `wandb.log({\"loss\": loss})`. Lightning's "
        '`self.log("loss", loss)` is not flagged: Lightning keeps logged tensors on the device. '
        "Only values shown to be tensors are flagged; "
        "`loss.item()` inside the same f-string is LA101's finding, not this one."
    )
    why_it_costs = (
        "Formatting a tensor calls `.item()` (or copies the whole tensor) under the hood, so it waits for "
        "every kernel queued so far. `add_scalar` does the same to store a number. Once per step, the GPU "
        "queue drains every step just to produce a log line."
    )
    example = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(f'step {step} loss {loss:.4f}')\n"
    )
    use_instead = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % log_interval == 0:\n"
        "        print(f'step {step} loss {loss.item():.4f}')\n"
    )
    fix_safety = "No automatic fix: choosing a log interval is the author's call."
    valid = (
        # Python numbers are already on the host.
        "import torch\n"
        "model.cuda()\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(f'step {step}/{len(loader)} lr {lr:.2e}')\n"
        "    logger.info('step %d', step)\n",
        # Periodic logging.
        "import torch\n"
        "import logging\n"
        "log = logging.getLogger(__name__)\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % args.log_interval == 0:\n"
        "        log.info('loss %s', loss)\n"
        "        print(loss)\n",
    )
    invalid = (
        "import logging\n"
        "import torch\n"
        "import wandb\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        "logger = logging.getLogger(__name__)\n"
        "writer = SummaryWriter()\n"
        "device = torch.device('cuda:0')\n"
        "for step, (x, y) in enumerate(train_loader):\n"
        "    loss = criterion(model(x.to(device)), y.to(device))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    print(loss)  # expect: LA104\n"
        "    pbar.set_description(f'loss {loss:.4f}')  # expect: LA104\n"
        "    logger.info('step %d loss %s', step, loss)  # expect: LA104\n"
        "    writer.add_scalar('train/loss', loss, step)  # expect: LA104\n"
        "    wandb.log({'loss': loss, 'step': step})  # expect: LA104\n"
        "    msg = 'loss %.3f' % loss  # expect: LA104\n"
        "    msg = 'loss {}'.format(loss)  # expect: LA104\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.Call, cst.FormattedStringExpression, cst.BinaryOperation)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if isinstance(node, cst.FormattedStringExpression):
            if ctx.is_tensor(node.expression):
                yield Report(
                    node.expression,
                    f"`{{{ctx.source(node.expression)}}}` formats a tensor in an f-string: its value is read on the host, so the CPU stalls until the GPU drains, once per step",
                )
        elif isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Modulo) and _is_string_expression(node.left):
                if isinstance(node.right, cst.Tuple):
                    values = [element.value for element in node.right.elements]
                else:
                    values = [node.right]
                if any(ctx.is_tensor(value) for value in values):
                    yield Report(
                        node,
                        "`%` formats a tensor: its value is read on the host, so the CPU stalls until the GPU drains, once per step",
                    )
        else:
            yield from self._call(cast(cst.Call, node), ctx)

    def _call(self, node: cst.Call, ctx):
        func = node.func
        arguments = [arg.value for arg in node.args if not arg.star]
        if isinstance(func, cst.Name):
            if func.value in _FORMATTING_BUILTINS and ctx.qualified_name(func) is None:
                if any(ctx.is_tensor(arg) for arg in _positional(node)):
                    yield Report(
                        node,
                        f"`{func.value}()` of a tensor reads its value on the host: the CPU stalls until the GPU drains, once per step",
                    )
            return
        if not isinstance(func, cst.Attribute):
            return
        method = func.attr.value
        receiver = func.value
        qualified = ctx.qualified_name(func) or ""
        if method == "log" and (qualified == "wandb.log" or "wandb" in (terminal_name(receiver) or "")):
            # wandb.log({"loss": loss}) turns each tensor value into a number on the host.
            tensor_args = any(ctx.is_tensor(value) for arg in arguments for value in _dict_values(arg))
        elif (
            (method == "format" and isinstance(receiver, _STRINGS))
            or (
                method in _LOG_METHODS
                and (qualified.startswith("logging.") or _LOGGER_NAME.search(terminal_name(receiver) or ""))
            )
            or method in {"set_postfix", "set_postfix_str", "set_description"}
        ):
            tensor_args = any(ctx.is_tensor(arg) for arg in arguments)
        elif method == "add_scalar":
            values = _positional(node)[1:2] + [
                arg.value for arg in node.args if arg.keyword and arg.keyword.value == "scalar_value"
            ]
            tensor_args = any(ctx.is_tensor(value) for value in values)
        else:
            return
        if tensor_args:
            yield Report(
                node,
                f"`{ctx.source(func)}(...)` is given a tensor: formatting it reads its value on the host, so the CPU stalls until the GPU drains, once per step",
            )
