"""Is this expression a tensor? A three-valued, intentionally modest answer.

TENSOR: we can show it (a torch call, a forward pass, a batch from a loader, arithmetic on one).
NOT_TENSOR: we can show it is not (a Python number, `.item()`, a NumPy call, a string, a shape).
UNKNOWN: anything else. Rules that need a tensor to be sure (truth value, printing) fire only on
TENSOR; rules whose trigger is already tensor-specific (`.item()`, `.cpu()`) fire unless NOT_TENSOR.
"""

from __future__ import annotations

import enum
import re

import libcst as cst

from .module_index import Binding, ModuleIndex, Scope
from .names import terminal_name
from .patterns import FORWARD_CALLEE
from .stepmodel import StepModel


class Kind(enum.Enum):
    TENSOR = "tensor"
    NOT_TENSOR = "not-tensor"
    UNKNOWN = "unknown"


# torch functions that do not return a tensor (the rest of `torch.*` does).
_TORCH_NON_TENSOR_PREFIXES = (
    "torch.cuda.",
    "torch.distributed.",
    "torch.backends.",
    "torch.utils.data.",
    "torch.utils.tensorboard.",
    "torch.optim.",
    "torch.jit.",
    "torch.amp.",
    "torch.autograd.grad_mode.",
    "torch.profiler.",
    "torch.compiler.",
    "torch.hub.",
    "torch.multiprocessing.",
    "torch.onnx.",
    "torch.fx.",
)
_TORCH_NON_TENSOR_FUNCTIONS = re.compile(
    r"^torch\.(is_\w+|get_\w+|set_\w+|use_\w+|device|dtype|Size|Generator|no_grad|enable_grad|"
    r"inference_mode|autocast|compile|load|save|manual_seed|seed|initial_seed|numel|typename|"
    r"cuda|nn\.(?!functional|utils\.clip_grad_norm_)\w.*)$"
)
# Tensor methods that return something other than a tensor.
_NON_TENSOR_METHODS = frozenset({
    "item", "tolist", "numpy", "size", "dim", "ndimension", "numel", "nelement", "element_size",
    "data_ptr", "is_contiguous", "is_floating_point", "is_complex", "get_device", "stride",
    "storage_offset", "keys", "values", "items", "format", "join", "split", "strip", "state_dict",
    "parameters", "named_parameters", "modules", "children", "__len__",
})
# Tensor methods that return a tensor when called on one.
_TENSOR_METHODS = frozenset({
    "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "prod", "std", "var", "norm",
    "abs", "exp", "log", "sqrt", "pow", "neg", "sigmoid", "softmax", "log_softmax", "relu", "tanh",
    "float", "double", "half", "bfloat16", "long", "int", "bool", "to", "cuda", "cpu", "detach",
    "clone", "contiguous", "view", "view_as", "reshape", "reshape_as", "flatten", "squeeze",
    "unsqueeze", "permute", "transpose", "t", "expand", "expand_as", "repeat", "type_as", "type",
    "eq", "ne", "gt", "lt", "ge", "le", "isnan", "isinf", "isfinite", "any", "all", "logical_and",
    "logical_or", "logical_not", "masked_fill", "gather", "index_select", "clamp", "clip", "round",
    "floor", "ceil", "add", "sub", "mul", "div", "matmul", "mm", "bmm", "nonzero", "count_nonzero",
    "cumsum", "squeeze_", "unsqueeze_", "add_", "mul_", "div_", "sub_", "zero_", "fill_", "where",
    "masked_select", "unique", "square", "rsqrt", "reciprocal", "sign", "diag", "trace",
})
# Names that, with nothing else to go on, hold tensors in training code.
_TENSOR_NAMES = re.compile(
    r"(?i)^(?!(use|ignore|compute|is|do|has|with|should|log|print|calc|get|best|min|max)_)"
    r"(loss|losses_?\w*|\w*_loss|loss_\w+|logits|\w*_logits|outputs?|preds?|predictions?|"
    r"y_?hat|probs|probabilities|grad_?norm|total_?norm)$"
)
_FLAG_NAME = re.compile(r"(?i)^(is|use|return|do|with|has|should|need|apply|enable)_|^(train|training|mode|inference|debug|verbose)$")
# Attribute names that hold tensors on model outputs: `outputs.loss`, `out.logits`.
_TENSOR_ATTRIBUTES = frozenset({"loss", "logits", "last_hidden_state", "hidden_states", "pred_boxes"})
_PY_NON_TENSOR_CALLS = frozenset({
    "float", "int", "bool", "len", "str", "repr", "round", "abs", "range", "list", "dict", "tuple",
    "set", "sorted", "isinstance", "hasattr", "getattr", "type", "print", "format", "open", "id",
})
_NON_TENSOR_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "grad_fn", "layout"})


class TensorInference:
    def __init__(self, index: ModuleIndex, steps: StepModel) -> None:
        self.index = index
        self.steps = steps
        self._busy: set[tuple[int, str]] = set()

    def kind(self, expr: cst.BaseExpression, scope: Scope, depth: int = 0) -> Kind:
        if depth > 12:
            return Kind.UNKNOWN
        method = getattr(self, f"_kind_{type(expr).__name__}", None)
        if method is None:
            return Kind.UNKNOWN
        return method(expr, scope, depth + 1)

    def is_tensor(self, expr: cst.BaseExpression, scope: Scope) -> bool:
        return self.kind(expr, scope) is Kind.TENSOR

    def maybe_tensor(self, expr: cst.BaseExpression, scope: Scope) -> bool:
        return self.kind(expr, scope) is not Kind.NOT_TENSOR

    # --- literals ------------------------------------------------------------------------------

    def _literal(self, expr, scope, depth) -> Kind:
        return Kind.NOT_TENSOR

    _kind_Integer = _kind_Float = _kind_Imaginary = _kind_SimpleString = _literal
    _kind_ConcatenatedString = _kind_FormattedString = _kind_Dict = _kind_DictComp = _literal
    _kind_Lambda = _literal

    # --- names ---------------------------------------------------------------------------------

    def _kind_Name(self, expr: cst.Name, scope: Scope, depth: int) -> Kind:
        name = expr.value
        if name in {"True", "False", "None"}:
            return Kind.NOT_TENSOR
        found = scope.lookup(name)
        if found is not None and not found[0] and self._is_forward_input(name, found[1]):
            return Kind.TENSOR
        if found is None or not found[0]:
            if self.index.imports.qualify(expr) is not None:
                return Kind.NOT_TENSOR  # an imported module or function, not a value we compute
            return Kind.TENSOR if _TENSOR_NAMES.match(name) else Kind.UNKNOWN
        bindings, owner = found
        key = (id(owner), name)
        if key in self._busy:
            return Kind.UNKNOWN  # `loss = loss / n`: the other bindings decide
        self._busy.add(key)
        try:
            kinds = [self._binding_kind(binding, depth) for binding in bindings]
        finally:
            self._busy.discard(key)
        if name in owner.params:  # a parameter that is also reassigned: `x = x * 2` in forward
            kinds.append(Kind.TENSOR if self._is_forward_input(name, owner) else Kind.UNKNOWN)
        if Kind.TENSOR in kinds:
            return Kind.TENSOR
        if kinds and all(k is Kind.NOT_TENSOR for k in kinds):
            return Kind.NOT_TENSOR
        return Kind.TENSOR if _TENSOR_NAMES.match(name) and Kind.NOT_TENSOR not in kinds else Kind.UNKNOWN

    def _is_forward_input(self, name: str, scope: Scope) -> bool:
        """A required parameter of an nn.Module's `forward` (`def forward(self, x)`) is a tensor.

        Parameters with defaults (`mask=None`), annotated with something other than a Tensor, or
        named like flags (`return_attn`, `is_training`) are left unknown.
        """
        function, owner = scope.function, scope.owner_class
        if function is None or owner is None or function.name.value != "forward" or name == "self":
            return False
        if not self.steps.is_torch_module(owner):
            return False
        for param in (*function.params.posonly_params, *function.params.params):
            if param.name.value != name:
                continue
            if param.default is not None or _FLAG_NAME.match(name):
                return False
            annotation = param.annotation
            return annotation is None or "Tensor" in self.index.module.code_for_node(annotation.annotation)
        return False

    def _binding_kind(self, binding: Binding, depth: int) -> Kind:
        value, scope = binding.value, binding.scope
        if binding.kind in ("value", "augment"):
            return self.kind(value, scope, depth)
        if binding.kind == "element":
            inner = self.kind(value, scope, depth)
            # `logits, loss = model(x, y)`: the elements of a forward pass's result are tensors.
            return Kind.TENSOR if inner is Kind.TENSOR else Kind.UNKNOWN
        if binding.kind == "loop":
            return self._loop_element_kind(value, scope, binding.position)
        return Kind.UNKNOWN

    def _loop_element_kind(self, iterable: cst.BaseExpression, scope: Scope, position: int) -> Kind:
        wrapper = terminal_name(iterable.func) if isinstance(iterable, cst.Call) else None
        if wrapper in ("zip", "enumerate"):
            args = _call_arguments(iterable)
            if wrapper == "enumerate":
                if position == 0:
                    return Kind.NOT_TENSOR  # the index
                return self._loop_element_kind(args[0], scope, 0) if args else Kind.UNKNOWN
            # zip(loader, range(a, b)): element i comes from the i-th iterable.
            return self._loop_element_kind(args[position], scope, 0) if position < len(args) else Kind.UNKNOWN
        if isinstance(iterable, cst.Call) and terminal_name(iterable.func) in {"range", "trange"}:
            return Kind.NOT_TENSOR
        if self.steps.is_loader(iterable, scope) or any(
            self.steps.is_loader(inner, scope) for inner in _call_arguments(iterable)
        ):
            return Kind.TENSOR  # batches from a DataLoader are tensors (or collections of them)
        return Kind.UNKNOWN

    # --- attributes, subscripts ----------------------------------------------------------------

    def _kind_Attribute(self, expr: cst.Attribute, scope: Scope, depth: int) -> Kind:
        attr = expr.attr.value
        if attr in _NON_TENSOR_ATTRIBUTES:
            return Kind.NOT_TENSOR
        if self.index.imports.qualify(expr) is not None:
            return Kind.NOT_TENSOR  # `math.pi`, `torch.float16`, `np.inf`
        if attr in {"data", "T", "mT", "grad", "real", "imag"}:
            return self.kind(expr.value, scope, depth)
        if isinstance(expr.value, cst.Name) and expr.value.value == "self":
            return self._self_attribute_kind(attr, scope, depth)
        if attr in _TENSOR_ATTRIBUTES:
            return Kind.TENSOR
        return Kind.UNKNOWN

    def _self_attribute_kind(self, attr: str, scope: Scope, depth: int) -> Kind:
        """`self.tokens` is a tensor when the class assigns it one (`self.tokens += (y >= 0).sum()`)."""
        owner = scope.owner_class
        bindings = owner.attributes.get(attr) if owner is not None else None
        if not bindings:
            return Kind.UNKNOWN
        key = (id(owner), "self." + attr)
        if key in self._busy:
            return Kind.UNKNOWN
        self._busy.add(key)
        try:
            kinds = [self._binding_kind(binding, depth) for binding in bindings]
        finally:
            self._busy.discard(key)
        if Kind.TENSOR in kinds:
            return Kind.TENSOR
        return Kind.NOT_TENSOR if all(k is Kind.NOT_TENSOR for k in kinds) else Kind.UNKNOWN

    def _kind_Subscript(self, expr: cst.Subscript, scope: Scope, depth: int) -> Kind:
        inner = self.kind(expr.value, scope, depth)
        return Kind.TENSOR if inner is Kind.TENSOR else Kind.UNKNOWN

    # --- operators -----------------------------------------------------------------------------

    def _kind_BinaryOperation(self, expr: cst.BinaryOperation, scope: Scope, depth: int) -> Kind:
        if isinstance(expr.operator, cst.Modulo) and isinstance(
            expr.left, (cst.SimpleString, cst.ConcatenatedString)
        ):
            return Kind.NOT_TENSOR  # "%.3f" % x is a string
        return _combine(self.kind(expr.left, scope, depth), self.kind(expr.right, scope, depth))

    def _kind_UnaryOperation(self, expr: cst.UnaryOperation, scope: Scope, depth: int) -> Kind:
        if isinstance(expr.operator, cst.Not):
            return Kind.NOT_TENSOR  # `not t` is a bool (the truth value itself is the sync)
        return self.kind(expr.expression, scope, depth)

    def _kind_Comparison(self, expr: cst.Comparison, scope: Scope, depth: int) -> Kind:
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in expr.comparisons):
            return Kind.NOT_TENSOR
        operands = [expr.left, *(c.comparator for c in expr.comparisons)]
        kinds = [self.kind(operand, scope, depth) for operand in operands]
        if Kind.TENSOR in kinds:
            return Kind.TENSOR
        return Kind.NOT_TENSOR if all(k is Kind.NOT_TENSOR for k in kinds) else Kind.UNKNOWN

    def _kind_BooleanOperation(self, expr: cst.BooleanOperation, scope: Scope, depth: int) -> Kind:
        return _combine(self.kind(expr.left, scope, depth), self.kind(expr.right, scope, depth))

    def _kind_IfExp(self, expr: cst.IfExp, scope: Scope, depth: int) -> Kind:
        return _combine(self.kind(expr.body, scope, depth), self.kind(expr.orelse, scope, depth))

    def _kind_Tuple(self, expr, scope, depth) -> Kind:
        return Kind.NOT_TENSOR

    _kind_List = _kind_ListComp = _kind_Set = _kind_SetComp = _kind_GeneratorExp = _kind_Tuple

    # --- calls ---------------------------------------------------------------------------------

    def _kind_Call(self, expr: cst.Call, scope: Scope, depth: int) -> Kind:
        func = expr.func
        qualified = self.index.imports.qualify(func)
        if qualified is not None:
            return _kind_of_library_call(qualified)
        if isinstance(func, cst.Name):
            if func.value in _PY_NON_TENSOR_CALLS:
                return Kind.NOT_TENSOR
            if func.value in self.index.classes:
                return Kind.UNKNOWN  # constructing one of the module's own classes
            if FORWARD_CALLEE.search(func.value) or self._is_model_instance(func.value, scope):
                return Kind.TENSOR
            return Kind.UNKNOWN
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _NON_TENSOR_METHODS:
                return Kind.NOT_TENSOR
            if method in _TENSOR_METHODS:
                receiver = self.kind(func.value, scope, depth)
                return receiver
            if isinstance(func.value, cst.Name) and func.value.value == "self" and FORWARD_CALLEE.search(method):
                return Kind.TENSOR  # `self.model(x)`, `self.criterion(out, y)`
        return Kind.UNKNOWN

    def _is_model_instance(self, name: str, scope: Scope) -> bool:
        found = scope.lookup(name)
        if found is None:
            return False
        for binding in found[0]:
            value = binding.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                value = value.func.value
            if isinstance(value, cst.Call):
                qualified = self.index.imports.qualify(value.func) or ""
                if qualified.startswith("torch.nn.") or qualified.startswith("torchvision.models"):
                    return True
        return False


def _kind_of_library_call(qualified: str) -> Kind:
    root = qualified.split(".")[0]
    if root in {"numpy", "math", "time", "random", "os", "sys", "json", "pandas", "statistics"}:
        return Kind.NOT_TENSOR
    if root != "torch":
        return Kind.UNKNOWN
    if qualified.startswith(_TORCH_NON_TENSOR_PREFIXES) or _TORCH_NON_TENSOR_FUNCTIONS.match(qualified):
        return Kind.NOT_TENSOR
    last = qualified.rsplit(".", 1)[-1]
    if last[:1].isupper() and not last.endswith("Tensor"):
        return Kind.NOT_TENSOR  # constructing an object: SummaryWriter, GradScaler, Linear
    return Kind.TENSOR


def _combine(left: Kind, right: Kind) -> Kind:
    if Kind.TENSOR in (left, right):
        return Kind.TENSOR
    if left is Kind.NOT_TENSOR and right is Kind.NOT_TENSOR:
        return Kind.NOT_TENSOR
    return Kind.UNKNOWN


def _call_arguments(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.Call):
        return [arg.value for arg in expr.args if arg.keyword is None]
    return []
