"""What a rule may ask about the module while it checks a node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import libcst as cst

from loopaudit.analysis.module_index import Frame, ModuleIndex, Scope
from loopaudit.analysis.stepmodel import StepModel
from loopaudit.analysis.tensors import Kind, TensorInference
from loopaudit.analysis.walk import parent_map

T = TypeVar("T")


class RuleContext:
    def __init__(self, index: ModuleIndex, steps: StepModel, tensors: TensorInference) -> None:
        self.index = index
        self.steps = steps
        self.tensors = tensors
        # Where the node being checked sits; set by the engine before each check.
        self.scope: Scope = index.module_scope
        self.frame: Frame = index.module_frame
        self._memo: dict[str, object] = {}

    def memoized(self, key: str, compute: Callable[[], T]) -> T:
        """`compute()`, once per analysis of the module: for what a rule works out about the whole
        module. Kept here, not in a rule's module-level dict, so it goes with the analysis (a tree
        kept alive past its analysis would be frozen out of the collector's sight, collector.py)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[return-value]

    def one_pass(self, node: cst.CSTNode) -> tuple[Frame, tuple[int, ...]]:
        """A key for the code `node` may run together with: its loop or function body (Frame.body), and
        the `else`/`elif` arms it sits in within that body. The `if` and `else` arms of one statement
        never run in the same pass (`if num_gpus > 1: reduce(loss).item()` / `else: loss.item()` is one
        read per step, not two): keying by the `else` arms alone keeps them apart, while an `if` arm
        shares its key with the code around the statement, which runs with it."""
        body = self.frame.body()
        arms = []
        child, parent = node, self.parent(node)
        while parent is not None and child is not body.node:
            if isinstance(parent, cst.If) and child is parent.orelse:
                arms.append(id(parent))
            child, parent = parent, self.parent(parent)
        return body, tuple(arms)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The node `node` sits in (None for the module)."""
        return self.memoized("parents", lambda: parent_map(self.index.module)).get(node)

    def qualified_name(self, node: cst.BaseExpression) -> str | None:
        """`T.cuda.synchronize` -> "torch.cuda.synchronize" when `import torch as T`."""
        return self.index.imports.qualify(node)

    def kind(self, node: cst.BaseExpression) -> Kind:
        """TENSOR (may be on the device), HOST_TENSOR, NOT_TENSOR or UNKNOWN (see tensors.py)."""
        return self.tensors.kind_at(node, self.scope, self.frame)

    def is_tensor(self, node: cst.BaseExpression) -> bool:
        """Shown to be a tensor that may live on the device (see tensors.py)."""
        return self.tensors.is_tensor(node, self.scope, self.frame)

    def maybe_tensor(self, node: cst.BaseExpression) -> bool:
        """Could be a device tensor: not shown to be a host tensor or a non-tensor. A value the code
        itself tests with `isinstance(v, torch.Tensor)` is a tensor only when shown to be one: such a
        helper takes numbers too (`if isinstance(v, torch.Tensor): v = v.item()`)."""
        if not self.tensors.maybe_tensor(node, self.scope, self.frame):
            return False
        if isinstance(node, cst.Name) and self._type_checked(node.value):
            return self.tensors.is_tensor(node, self.scope, self.frame)
        return True

    def _type_checked(self, name: str) -> bool:
        function = self.frame.enclosing_function()
        if function is None:
            return False
        for site in function.all_calls:
            call = site.call
            test = self.index.imports.qualify(call.func) or (call.func.value if isinstance(call.func, cst.Name) else "")
            # `isinstance(v, torch.Tensor)`, `torch.is_tensor(v)`, `type(v) == torch.Tensor` (DrQ-v2's logger)
            if test not in ("isinstance", "torch.is_tensor", "type") or not call.args:
                continue
            subject = call.args[0].value
            if isinstance(subject, cst.Name) and subject.value == name:
                return True
        return False

    def source(self, node: cst.CSTNode, limit: int = 40) -> str:
        """The node's code on one line, for messages that name their trigger. Long code keeps both
        ends (`F.cross_entropy(...='sum').item()`): the end of a chain is what syncs."""
        text = " ".join(self.index.module.code_for_node(node).split())
        if len(text) <= limit:
            return text
        keep = (limit - 3) // 2
        return text[:keep] + "..." + text[-keep:]

    @staticmethod
    def method_call(node: cst.CSTNode, *names: str) -> cst.BaseExpression | None:
        """The receiver of `receiver.name(...)` when `node` is such a call, else None."""
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in names:
            return node.func.value
        return None
