"""Is this expression a tensor, and could it be on the GPU? An intentionally modest answer.

TENSOR: a tensor that is (or may be) on the device: a forward pass, a loss, anything moved with
  `.to(device)`/`.cuda()`, a batch inside a framework step hook, arithmetic involving one.
HOST_TENSOR: a tensor shown to live in host memory: a batch straight from a DataLoader (before
  it is moved), `.cpu()`, `torch.zeros(n)` without `device=`. Reading it is no device sync.
NOT_TENSOR: shown not to be a tensor: a Python number, `.item()`, a NumPy call, a string, a shape.
UNKNOWN: anything else.
Rules that need a tensor to be sure (truth value, printing) fire only on TENSOR; rules whose trigger
is already tensor-specific (`.item()`, `.cpu()`) fire on TENSOR and UNKNOWN.
"""

from __future__ import annotations

import contextlib
import enum
import re
from typing import TYPE_CHECKING, cast

import libcst as cst

from loopaudit.analysis.module_index import (
    STAR_KWARGS,
    Binding,
    Frame,
    LoopInfo,
    ModuleIndex,
    Scope,
    argument_for,
    loop_within,
    named_param,
)
from loopaudit.analysis.names import dotted_name, param_default, terminal_name
from loopaudit.analysis.patterns import (
    BATCH_FETCH,
    TORCH_CONVERSIONS,
    TORCH_FACTORIES,
    calls_a_model,
    next_of,
    unwrap_iterable,
)
from loopaudit.analysis.stepmodel import StepModel, indexed_walk, looks_like_class
from loopaudit.analysis.walk import Containment

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from loopaudit.analysis.module_index import FunctionInfo


class Kind(enum.Enum):
    TENSOR = "tensor"
    HOST_TENSOR = "host-tensor"
    NOT_TENSOR = "not-tensor"
    UNKNOWN = "unknown"


# torch functions that do not return a tensor (the rest of `torch.*` does).
_TORCH_NON_TENSOR_PREFIXES = (
    "torch.cuda.",
    # The other accelerators' runtime modules answer questions (`torch.npu.is_available()`).
    "torch.xpu.",
    "torch.npu.",
    "torch.mps.",
    "torch.mtia.",
    "torch.accelerator.",
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
    r"^torch\.(is_\w+|are_\w+|get_\w+|set_\w+|use_\w+|device|dtype|Size|Generator|no_grad|enable_grad|"
    r"inference_mode|autocast|compile|load|save|manual_seed|seed|initial_seed|numel|typename|"
    r"cuda|nn\.(?!functional|utils\.clip_grad_norm_)\w.*)$"
)
# Tensor methods that return something other than a tensor.
_NON_TENSOR_METHODS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "data_ptr",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "get_device",
        "stride",
        "storage_offset",
        "keys",
        "values",
        "items",
        "format",
        "join",
        "split",
        "strip",
        "state_dict",
        "parameters",
        "named_parameters",
        "modules",
        "children",
        "__len__",
    }
)
# Tensor methods that return a tensor when called on one.
_TENSOR_METHODS = frozenset(
    {
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "prod",
        "std",
        "var",
        "norm",
        "abs",
        "exp",
        "log",
        "sqrt",
        "pow",
        "neg",
        "sigmoid",
        "softmax",
        "log_softmax",
        "relu",
        "tanh",
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "bool",
        "to",
        "cuda",
        "cpu",
        "detach",
        "clone",
        "contiguous",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "t",
        "expand",
        "expand_as",
        "repeat",
        "type_as",
        "type",
        "eq",
        "ne",
        "gt",
        "lt",
        "ge",
        "le",
        "isnan",
        "isinf",
        "isfinite",
        "any",
        "all",
        "logical_and",
        "logical_or",
        "logical_not",
        "masked_fill",
        "gather",
        "index_select",
        "clamp",
        "clip",
        "round",
        "floor",
        "ceil",
        "add",
        "sub",
        "mul",
        "div",
        "matmul",
        "mm",
        "bmm",
        "nonzero",
        "count_nonzero",
        "cumsum",
        "squeeze_",
        "unsqueeze_",
        "add_",
        "mul_",
        "div_",
        "sub_",
        "zero_",
        "fill_",
        "where",
        "masked_select",
        "unique",
        "square",
        "rsqrt",
        "reciprocal",
        "sign",
        "diag",
        "trace",
        # (and those that return a tuple of tensors: their elements are tensors)
        "sort",
        "argsort",
        "topk",
        "kthvalue",
        "median",
        "mode",
        "chunk",
        "unbind",
        "narrow",
        "select",
        "flip",
        "roll",
        "cumprod",
        "triu",
        "tril",
        "sin",
        "cos",
        "log1p",
        "expm1",
        "logsumexp",
        "erf",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "index_add",
        "index_add_",
        "masked_fill_",
        "masked_scatter",
        "copy_",
        "clamp_",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "new_tensor",
        "outer",
        "dot",
        "cross",
        "addmm",
        "baddbmm",
        "remainder",
        "fmod",
        "floor_divide",
        "true_divide",
        "argwhere",
        "nan_to_num",
        "softplus",
        "lerp",
        "unfold",
        "split_with_sizes",
        "new",
        "index",
        "index_fill",
        "index_fill_",
        "index_copy",
        "index_copy_",
        "index_put",
        "index_put_",
        "resize_",
        "resize_as_",
        "fill_diagonal_",
        "masked_scatter_",
        "max_pool2d",
    }
)
# What following a parameter to its callers' arguments costs of the depth (`kind`'s bound): chains
# of calls through parameters and return values stay short, two helpers deep at most (faster-rcnn's
# `forward` -> `_sample_rois(gt_boxes)` -> `_get_bbox_regression_labels(labels_batch)`).
_PARAMETER_HOP = 4
# Tensor methods that read a shape or a value: they put nothing on the device.
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "nelement", "ndimension", "item", "tolist", "numpy", "stride"})
# torch's dtypes (`torch.float16`): `.to(torch.float16)` converts, it does not move.
TORCH_DTYPES = frozenset(
    {
        "float",
        "float16",
        "float32",
        "float64",
        "double",
        "half",
        "bfloat16",
        "int",
        "int8",
        "int16",
        "int32",
        "int64",
        "long",
        "short",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "cfloat",
        "cdouble",
    }
)
# Of those, the ones that move the tensor: `.cpu()` brings it to the host, the others to the device.
_TO_HOST = frozenset({"cpu"})
_TO_DEVICE = frozenset({"cuda", "to"})
# Names that, with nothing else to go on, hold tensors in training code.
_TENSOR_NAMES = re.compile(
    r"(?i)^(?!(use|ignore|compute|is|do|has|with|should|log|print|calc|get|best|min|max|return|need|apply|enable)_)"
    r"(?!.*_(fn|fns|func|funcs|function|functions|fct|type|types|name|names|weight|weights|scale|cfg|config|"
    r"kwargs|args|dict|list|history|meter|meters|tracker|key|keys|mode|coef|coeff)$)"
    r"(loss|losses_?\w*|\w*_loss|loss_\w+|logits|\w*_logits|outputs?|preds?|predictions?|"
    r"y_?hat|probs|probabilities|grad_?norm|total_?norm)$"
)
# `bool`, `Optional[int]`, `float | None`, `Literal["mean", "sum"]`: annotations no tensor satisfies.
_NON_TENSOR_BASE = r"(?:bool|int|float|str|(?:typing\.)?Literal\[[^\]]*\])"
_NON_TENSOR_ANNOTATION = re.compile(
    rf"^\s*(?:(?:typing\.)?Optional\[\s*{_NON_TENSOR_BASE}\s*\]|{_NON_TENSOR_BASE}(?:\s*\|\s*None)?)\s*$"
)
_FLAG_NAME = re.compile(
    r"(?i)^(is|use|return|do|with|has|should|need|apply|enable)_|_(type|mode|name|kind|flag)$|"
    r"^(train|training|mode|inference|debug|verbose|kind|name|reduction|dim|axis)$"
)
# Attribute names that hold tensors on model outputs: `outputs.loss`, `out.logits`.
_TENSOR_ATTRIBUTES = frozenset({"loss", "logits", "last_hidden_state", "hidden_states", "pred_boxes"})
_PY_NON_TENSOR_CALLS = frozenset(
    {
        "float",
        "int",
        "bool",
        "len",
        "str",
        "repr",
        "round",
        "abs",
        "range",
        "list",
        "dict",
        "tuple",
        "set",
        "sorted",
        "isinstance",
        "hasattr",
        "getattr",
        "type",
        "print",
        "format",
        "open",
        "id",
    }
)
# torch functions that create a tensor: on the host unless given `device=`.
_TORCH_CREATION = TORCH_FACTORIES | TORCH_CONVERSIONS | {"frombuffer"}
# Methods that read a value out of a collection of tensors (a batch dict): `inputs.pop("labels")`.
_CONTAINER_METHODS = frozenset({"pop", "get"})
# Containers of settings: what `.get(...)` reads from them is an option, not a tensor.
_SETTINGS_NAME = re.compile(r"(?i)(^|_)(kwargs|opt|opts|args|config|cfg|conf|params|hparams|hps|settings|options)$")
# Parameters of framework step hooks that hold the batch, already moved to the device by the framework.
_HOOK_BATCH_PARAMS = frozenset({"batch", "inputs", "input", "data", "sample", "samples"})
# Methods of an nn.Module that iterate its tensors (named_*: (name, tensor) pairs).
_PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers"})
# Fields of batch objects (PyG's Batch, HF's BatchEncoding) that hold Python numbers, not tensors.
_COUNT_ATTRIBUTES = frozenset(
    {
        "num_graphs",
        "num_nodes",
        "num_edges",
        "num_features",
        "num_node_features",
        "num_edge_features",
        "batch_size",
        "keys",
        "is_cuda",
    }
)
_NON_TENSOR_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "requires_grad",
        "grad_fn",
        "layout",
        # Not a tensor's: a module's flag and configuration (`unwrap_model(unet).config.in_channels`), a
        # device's type and index (`device.type == "npu"`).
        "training",
        "config",
        "type",
        "index",
    }
)


class TensorInference:
    def __init__(self, index: ModuleIndex, steps: StepModel) -> None:
        self.index = index
        self.steps = steps
        # keyed by (id(scope), name), or (id(scope), name, id(read)) for a read that sees its block's bindings only
        self._busy: set[tuple[int, str] | tuple[int, str, int]] = set()
        self._provisional: dict[tuple[int, str] | tuple[int, str, int], Kind] = {}
        self._cycles = 0  # reads that met a name still being decided (_kind_Name)
        self._returns: dict[int, tuple[Kind, ...]] = {}
        self._in_place: dict[int, bool] = {}  # id(function) -> it computes with torch alone (_computes_in_place)
        # Tensor-like names (`loss`, `output`) count as tensors, except while working out what a
        # function returns: a guess there would travel to every caller as if it were known.
        self._guess_from_names = True
        self._where: LoopInfo | None = None  # the loop the expression being asked about sits in
        # The binding whose value is being read, if any: names in it see the bindings before it (below).
        self._reading: Binding | None = None
        self._contains = Containment()  # is a read inside a binding's own value (asked per read)

    def kind_at(self, expr: cst.BaseExpression, scope: Scope, frame: Frame | None) -> Kind:
        """The kind of `expr` as seen from `frame` (where the expression is), see `_reaching`."""
        saved = self._where
        self._where = frame.innermost_loop() if frame is not None else None
        try:
            return self.kind(expr, scope)
        finally:
            self._where = saved

    def shown_kind_at(self, expr: cst.BaseExpression, scope: Scope, frame: Frame | None) -> Kind:
        """`kind_at` without taking tensor-like names at their word (`losses_reduced`, a float): what
        the code shows. For values that fan into `**kwargs`, where one tensor makes them all count."""
        with self._names_not_guessed():
            return self.kind_at(expr, scope, frame)

    @contextlib.contextmanager
    def _names_not_guessed(self) -> Iterator[None]:
        """Within it, a name of unknown kind stays unknown however tensor-like it sounds."""
        saved, self._guess_from_names = self._guess_from_names, False
        try:
            yield
        finally:
            self._guess_from_names = saved

    def kind(self, expr: cst.BaseExpression, scope: Scope, depth: int = 0) -> Kind:
        # `depth` counts the hops through bindings, parameters, calls and operators. Reading into a
        # chain (a method's receiver, a subscript's or an attribute's value) costs none: it does not
        # branch, and `gt_boxes[:, :, 4].contiguous().view(-1)` is one value, not five.
        if depth > 14:
            return Kind.UNKNOWN
        method: Callable[[cst.BaseExpression, Scope, int], Kind] | None = getattr(
            self, f"_kind_{type(expr).__name__}", None
        )
        if method is None:
            return Kind.UNKNOWN
        return method(expr, scope, depth + 1)

    def is_tensor(self, expr: cst.BaseExpression, scope: Scope, frame: Frame | None = None) -> bool:
        """Shown to be a tensor that may live on the device."""
        return self.kind_at(expr, scope, frame) is Kind.TENSOR

    def maybe_tensor(self, expr: cst.BaseExpression, scope: Scope, frame: Frame | None = None) -> bool:
        """Not shown to be anything else than a device tensor."""
        return self.kind_at(expr, scope, frame) in (Kind.TENSOR, Kind.UNKNOWN)

    # --- literals ------------------------------------------------------------------------------

    def _literal(self, expr: cst.BaseExpression, scope: Scope, depth: int) -> Kind:
        return Kind.NOT_TENSOR

    _kind_Integer = _kind_Float = _kind_Imaginary = _kind_SimpleString = _literal
    _kind_ConcatenatedString = _kind_FormattedString = _kind_Dict = _kind_DictComp = _literal
    _kind_Lambda = _kind_Tuple = _kind_List = _kind_ListComp = _kind_Set = _kind_SetComp = _literal
    _kind_GeneratorExp = _literal

    # --- names ---------------------------------------------------------------------------------

    def _kind_Name(self, expr: cst.Name, scope: Scope, depth: int) -> Kind:
        name = expr.value
        if name in {"True", "False", "None"}:
            return Kind.NOT_TENSOR
        found = scope.lookup(name)
        if found is None:
            if self.index.imports.qualify(expr) is not None:
                return Kind.NOT_TENSOR  # an imported module or function, not a value we compute
            return Kind.TENSOR if self._guess_from_names and _TENSOR_NAMES.match(name) else Kind.UNKNOWN
        bindings, owner = found
        own = self.index.comprehension_reads.get(id(expr))
        if own is not None:
            # A comprehension's own target: `[x.to(device) for x in inputs]` reads what `inputs` holds.
            seen_here: list[Binding] | None
            seen_here = own
            bindings = own
        else:
            seen_here = self.bindings_at(expr, bindings)
            bindings = seen_here if seen_here is not None else self._before_reading(self._reaching(bindings), owner)
        if seen_here is None and scope is owner:
            bindings = self._not_later(expr, bindings)
        if len(bindings) > 1 or (bindings and name in owner.params):
            # In `outputs = nms(outputs)`, the `outputs` passed in is what an earlier binding made
            # (or, for a parameter, `x = x.to(device)`, what the callers pass): a binding is never
            # what its own right-hand side reads.
            bindings = [b for b in bindings if not self._contains.holds(b.value, expr)] or (
                [] if name in owner.params else bindings
            )
        # A read that sees only the bindings before it in its block cannot be part of a cycle: those
        # bindings' own reads see still earlier ones. Its key is the read itself.
        key = (id(owner), name) if seen_here is None else (id(owner), name, id(expr))
        if key in self._busy:
            # `x = x.to(device)` or `loss = loss / n` refers to the name being decided: use what
            # the other bindings said (see the second round below), or nothing yet.
            if key not in self._provisional:
                self._cycles += 1
            return self._provisional.get(key, Kind.UNKNOWN)
        self._busy.add(key)
        try:
            kinds, cyclic = [], []
            for binding in bindings:
                before = self._cycles
                kinds.append(self._binding_kind(binding, depth))
                cyclic.append(self._cycles != before)
            # The first round's answer comes from the bindings that did not read a name still being
            # decided: `w = w / torch.sum(w)` guessed from a name not yet known says nothing yet.
            first = _merge([k for k, c in zip(kinds, cyclic) if k is not Kind.UNKNOWN and not c])
            if first is Kind.UNKNOWN:
                first = _merge([k for k in kinds if k is not Kind.UNKNOWN])
            if (Kind.UNKNOWN in kinds or any(cyclic)) and first is not Kind.UNKNOWN:
                # Second round: a binding that refers to the name itself now sees the others' kind,
                # so `for x in loader: x = x.to(device)` makes `x` a device tensor.
                self._provisional[key] = first
                kinds = [self._binding_kind(binding, depth) for binding in bindings]
        finally:
            self._busy.discard(key)
            self._provisional.pop(key, None)
        if name in owner.params and seen_here is None and not self._replaces_parameter(expr, bindings, owner):
            # a parameter, possibly also reassigned: `x = x * 2` in forward (unless a binding earlier in
            # the read's own block replaced it: `flow = flow.cpu().numpy()` then `flow[0]`)
            declared = self._declared_not_tensor(name, owner)
            kinds.append(Kind.NOT_TENSOR if declared else self._parameter_kind(name, owner, depth))
        merged = _merge(kinds)
        if merged is Kind.UNKNOWN and self._moved_later(expr, found[0]):
            return Kind.HOST_TENSOR
        # A tensor-like name (`pred`, `loss`) is taken at its word, except as the element of an iterable
        # we know nothing about: `for pred, gt in zip(preds_str, labels)` walks decoded strings.
        if (
            self._guess_from_names
            and merged is Kind.UNKNOWN
            and _TENSOR_NAMES.match(name)
            and not {Kind.NOT_TENSOR, Kind.HOST_TENSOR} & set(kinds)
            and not any(binding.kind == "loop" for binding in bindings)
            # `losses = AverageMeter()`: an object of a class, whatever its name says (its methods may
            # still hand back tensors: `accelerator.gather(loss)`, so its kind stays unknown)
            and not all(
                b.kind == "value" and isinstance(b.value, cst.Call) and _constructs_object(b.value.func)
                for b in bindings
            )
            and not (name in owner.params and _literal_default(name, owner))  # `fmax_loss=None`: a setting
        ):
            return Kind.TENSOR
        return merged

    def _moved_later(self, read: cst.Name, bindings: list[Binding]) -> bool:
        """Does the loop body around the read move the name's value to the device later with a batch
        helper, rebinding the name (`x, lengths = to_cuda(x, lengths)`)? Until then it is on the host:
        XLM's `assert pred_mask.sum().item() == y.size(0)` before `to_cuda(..., pred_mask, y)`."""
        use = self.index.uses.get(id(read))
        if use is None or use[2] is None:
            return False
        order, _, loop = use
        return any(
            binding.loop is loop
            and (binding.order >= order or self._contains.holds(binding.value, read))
            and _moves_name(binding, read.value)
            for binding in bindings
        )

    def _declared_not_tensor(self, name: str, scope: Scope) -> bool:
        """`pre_logits: bool = False`, `scale=1.0`: a parameter its signature declares a flag or a
        number (by annotation, or by a literal default and no tensor annotation) is no tensor,
        whatever its name suggests (timm's `forward_head(x, pre_logits=False)`)."""
        param = named_param(scope.function, name) if scope.function is not None else None
        if param is None:
            return False
        if param.annotation is not None:
            return (
                _NON_TENSOR_ANNOTATION.match(self.index.module.code_for_node(param.annotation.annotation)) is not None
            )
        default = param.default
        if isinstance(default, cst.UnaryOperation):
            default = default.expression  # `-1`
        return isinstance(default, (cst.Integer, cst.Float, cst.SimpleString)) or (
            isinstance(default, cst.Name) and default.value in ("True", "False")
        )

    def _parameter_kind(self, name: str, scope: Scope, depth: int = 0) -> Kind:
        """Parameters the framework fills with device tensors: an nn.Module's `forward(self, x)` inputs,
        and the batch of a step hook (`training_step(self, batch, batch_idx)`, `compute_loss(self,
        model, inputs)`). Parameters with defaults, or annotated or named like flags, stay unknown."""
        function, owner = scope.function, scope.owner_class
        if function is None or name == "self":
            return Kind.UNKNOWN
        info = self.steps.function_info(function)
        hook = self.steps.hook_name(info) if info is not None else None
        if hook is not None:
            if name not in _HOOK_BATCH_PARAMS:
                return Kind.UNKNOWN
            # ignite hands its process function the loader's batch as it is: the function moves it.
            return Kind.HOST_TENSOR if hook.startswith("ignite") else Kind.TENSOR
        star = function.params.star_kwarg
        if isinstance(star, cst.Param) and star.name.value == name:
            return self._keywords_kind(info, depth) if info is not None else Kind.UNKNOWN
        rest = function.params.star_arg
        if isinstance(rest, cst.Param) and rest.name.value == name:
            return self._rest_kind(info, depth) if info is not None else Kind.UNKNOWN
        if owner is None or function.name.value != "forward" or not self.steps.is_torch_module(owner):
            return self._argument_kind(name, info, depth) if info is not None else Kind.UNKNOWN
        passed = _merge(self._passed_elsewhere(name, info)) if info is not None else Kind.UNKNOWN
        if passed is not Kind.UNKNOWN:
            return passed  # callers in other modules say what they hand the model (SPADE: the raw batch)
        for param in (*function.params.posonly_params, *function.params.params):
            if param.name.value != name:
                continue
            if param.default is not None or _FLAG_NAME.match(name):
                return Kind.UNKNOWN
            annotation = param.annotation
            if annotation is None or "Tensor" in self.index.module.code_for_node(annotation.annotation):
                return Kind.TENSOR
        return Kind.UNKNOWN

    def _argument_kind(self, name: str, function: FunctionInfo, depth: int = 0) -> Kind:
        """What the call sites pass for parameter `name`: `log_step(loss)` makes `loss` a tensor. The
        module's own call sites, and those of other modules of the project (project.py)."""
        depth += _PARAMETER_HOP
        kinds = [
            self.kind(argument, scope, depth) if argument is not None else Kind.UNKNOWN
            for argument, scope in self.arguments_for(name, function)
        ]
        return _merge(kinds + self._passed_elsewhere(name, function))

    def _rest_kind(self, function: FunctionInfo, depth: int = 0) -> Kind:
        """What the callers pass into `*inputs`, here and in other modules: the positional arguments
        past the named ones (`model.set_input(images, labels)` into `def set_input(self, *inputs)`:
        a loop over `inputs` walks the batch's tensors)."""
        depth += _PARAMETER_HOP
        named = len(function.positional_params)
        kinds = []
        for site in function.call_sites[:8]:
            positional = [arg for arg in site.call.args if arg.keyword is None]
            if self.steps.calls_partial(site):
                kinds.append(Kind.UNKNOWN)
                continue
            starred = [arg for arg in positional if arg.star == "*"]
            if starred:
                # `self.cuda(*items)` of a batch: the batch's elements, whichever parameters they fill
                kinds.extend(self.kind(arg.value, site.scope, depth) for arg in starred)
                positional = [arg for arg in positional if not arg.star]
            kinds.extend(self.kind(arg.value, site.scope, depth) for arg in positional[named:])
        facts = self.steps.facts
        if facts is not None:
            kinds.extend(
                Kind(kind)
                for qualname, param, kind in facts.argument_kinds
                if qualname == function.qualname and param.isdigit() and int(param) >= named
            )
        return _merge(kinds)

    def _keywords_kind(self, function: FunctionInfo, depth: int = 0) -> Kind:
        """What the callers pass into `**kwargs`, here and in other modules: a device tensor when any
        keyword passes one (`meters.update(loss=loss, lr=lr)`: a loop over the values reads each in
        turn, so one device tensor is enough to wait for)."""
        depth = max(depth, 6) + 2
        named = set(function.positional_params) | {p.name.value for p in function.node.params.kwonly_params}
        with self._names_not_guessed():  # (see shown_kind_at)
            kinds = [
                self.kind(arg.value, site.scope, depth)
                for site in function.call_sites[:8]
                for arg in site.call.args
                if arg.keyword is not None and arg.keyword.value not in named
            ]
        return _merge(kinds + self._passed_elsewhere(STAR_KWARGS, function))

    def _passed_elsewhere(self, name: str, function: FunctionInfo) -> list[Kind]:
        """What the call sites in other modules pass for parameter `name` (project.py)."""
        facts = self.steps.facts
        if facts is None or not facts.argument_kinds:
            return []
        return [
            Kind(kind)
            for qualname, param, kind in facts.argument_kinds
            if param == name and qualname == function.qualname
        ]

    def arguments_for(self, name: str, function: FunctionInfo) -> list[tuple[cst.BaseExpression | None, Scope]]:
        """The expression each of the module's call sites of `function` passes for parameter `name`
        (None where it cannot be told, e.g. behind `*args`), at most 8 sites."""
        return [
            # (a call that only hands the function over, `trainer.eval(evaluate, ...)`, passes it nothing)
            (
                None
                if self.steps.calls_partial(site) or self.steps.hands_over(site, function)
                else argument_for(function, name, site.call),
                site.scope,
            )
            for site in function.call_sites[:8]
        ]

    def bindings_at(self, name: cst.Name, bindings: list[Binding]) -> list[Binding] | None:
        """The bindings a read of `name` sees when the same statement block binds the name earlier:
        the last such binding and whatever nested statements bind after it. In `points = points.numpy();
        points = augment(points); points = torch.Tensor(points)`, the second line reads the array,
        not the tensors the loop target and the third line make. None when no binding in the block
        comes first (the read may see a value from before the block, or from the previous iteration)."""
        use = self.index.uses.get(id(name))
        if use is None:
            return None
        block: int | None
        order, block, read_loop = use
        earlier = [b for b in bindings if b.order < order and not self._contains.holds(b.value, name)]
        # The innermost block around the read (its own, then the ones it is nested in) that binds the
        # name before it: `label_ids = label_ids.to('cpu').numpy()` before the loops that read
        # `label_ids[i][j]`. (`loss /= n` updates the value a binding before it made: no replacement.)
        # Only a read the rules ask about climbs: reads inside a binding's value keep to their own
        # block, or following `h = h.float()` in thirty `if`s would walk every path through them.
        last = None
        while block is not None:
            last = max(
                (b for b in earlier if b.block == block and b.kind != "augment"), key=lambda b: b.order, default=None
            )
            if last is not None or self._reading is not None:
                break
            block = self.index.block_parents.get(block)
        if last is None:
            return None
        seen = self._unshadowed([b for b in earlier if b.order >= last.order], order, name) or [last]
        # A loop between that binding and the read carries its own later bindings round to the read.
        between = []
        loop = read_loop
        while loop is not None and not loop_within(last.loop, loop):
            between.append(loop)
            loop = loop.parent_loop
        carried = [b for b in bindings if b.order > order and any(loop_within(b.loop, around) for around in between)]
        return seen + carried

    def _not_later(self, name: cst.Name, bindings: list[Binding]) -> list[Binding]:
        """A binding later in the function than the read cannot reach it, unless a loop of the function
        encloses both (its next iteration reads it): in `h = x.nonzero().cpu()` ... `if h.dim() == 0:
        h = [h.item() + 1]` ... `h = [0] + h`, the `.item()` reads the host tensor only."""
        use = self.index.uses.get(id(name))
        if use is None:
            return bindings
        order, _, loop = use
        enclosing = set()
        while loop is not None:
            enclosing.add(id(loop))
            loop = loop.parent_loop
        kept: list[Binding] = []
        for binding in bindings:
            around = binding.loop
            while around is not None and id(around) not in enclosing:
                around = around.parent_loop
            if binding.order < order or around is not None:
                kept.append(binding)
        return self._unshadowed(kept, order, name) or bindings

    def _unshadowed(self, bindings: list[Binding], order: int, read: cst.Name) -> list[Binding]:
        """Drop the bindings that a later one replaces before a read at `order` that comes after both:
        a later binding in the same statement block, or in a block around it (which runs after the
        statement holding the first). In `if a: mask = np.random.rand(n) <= p; mask =
        torch.from_numpy(mask)`, a read after the `if` sees the tensor, never the array."""
        # (`pred = pred.cpu()` is met before the read in its own value, and replaces nothing for it)
        replacing = [
            b
            for b in bindings
            if b.kind in ("value", "element", "with") and b.order < order and not self._contains.holds(b.value, read)
        ]
        if not replacing:
            return bindings
        reach = {id(later): self._reach_block(later, read.value) for later in replacing}
        kept = []
        around: int | None
        for binding in bindings:
            around, blocks = binding.block, set()
            while around is not None:
                blocks.add(around)
                around = self.index.block_parents.get(around)
            if binding.kind == "loop" and binding.loop is not None and binding.loop.node.body is not None:
                blocks.add(id(binding.loop.node.body))  # a loop's target is bound anew at the top of its body
            if not any(
                reach[id(later)] in blocks and binding.order < later.order and later is not binding
                for later in replacing
            ) and not self._every_arm_replaces(binding, blocks, replacing):
                kept.append(binding)
        return kept

    def _replaces_parameter(self, read: cst.Name, bindings: list[Binding], owner: Scope) -> bool:
        """Does a binding before the read replace the parameter's value on every path: one at the top
        of the function's body, or one under a test that narrows it there (`if type(mask) not in
        [list, tuple]: mask = [mask]`)?"""
        use = self.index.uses.get(id(read))
        function = owner.function
        if use is None or function is None or not isinstance(function.body, cst.IndentedBlock):
            return False
        top = id(function.body)
        for binding in bindings:
            if binding.order >= use[0] or binding.kind not in ("value", "element", "with"):
                continue
            if self._reach_block(binding, read.value) == top:
                return True
        return False

    def _reach_block(self, binding: Binding, name: str) -> int:
        """The block a binding of `name` replaces earlier ones in: its own, or, for one under a test
        that narrows the name (`if isinstance(v, torch.Tensor): v = v.item()`), the block around
        the `if`, as the test decides what `v` is after it on both paths (converted, or never a tensor)."""
        if self.index.tensor_checks.get(binding.block) == name:
            return self.index.block_parents.get(binding.block, binding.block)
        return binding.block

    def _every_arm_replaces(self, binding: Binding, blocks: set[int], replacing: list[Binding]) -> bool:
        """Does an `if`/`elif`/`else` chain after `binding`, at its level or around it, bind the name
        anew in every arm (`if a: y = y.numpy() elif b: ... else: y = ...`)?"""
        arms_binding = {later.block for later in replacing if later.order > binding.order}
        for arm in arms_binding:
            chain = self.index.exhaustive_arms.get(arm)
            if (
                chain is not None
                and self.index.block_parents.get(arm) in blocks
                and all(a in arms_binding for a in chain)
            ):
                return True
        return False

    def reaching_bindings(self, bindings: list[Binding], frame: Frame | None) -> list[Binding]:
        """The bindings of a name that reach an expression in `frame` (see `_reaching`)."""
        saved = self._where
        self._where = frame.innermost_loop() if frame is not None else None
        try:
            return self._reaching(bindings)
        finally:
            self._where = saved

    def binding_kind(self, binding: Binding) -> Kind:
        """The kind of the value one binding gives its name."""
        return self._binding_kind(binding, 1)

    def _reaching(self, bindings: list[Binding]) -> list[Binding]:
        """When the name is the target of a loop around the place asked about, only the bindings
        inside that loop reach it: `for images, targets in val_loader:` sees its own `targets`, not
        the training loop's `targets = targets.to(device)`."""
        if self._where is None:
            return bindings
        targets = {id(b.loop) for b in bindings if b.kind == "loop" and b.loop is not None}
        loop: LoopInfo | None
        loop = self._where
        while loop is not None and id(loop) not in targets:
            loop = loop.parent_loop
        if loop is None:
            return bindings
        return [b for b in bindings if loop_within(b.loop, loop)]

    def _binding_kind(self, binding: Binding, depth: int) -> Kind:
        saved = self._where, self._reading
        self._where = binding.loop  # a binding's value is evaluated where the binding is
        self._reading = binding
        try:
            return self._binding_value_kind(binding, depth)
        finally:
            self._where, self._reading = saved

    def _before_reading(self, bindings: list[Binding], owner: Scope) -> list[Binding]:
        """In the value of a binding, a name holds what the bindings before it gave, when the name was
        bound earlier at the same level (same loop body, or the same function outside loops): in
        `x, labels = next(it); c = labels.clone(); labels = labels.to(device)`, `c` is made from the
        host `labels`, not the moved one. A name not bound earlier at that level keeps every binding:
        it is carried over from the previous iteration (`h = cell(x, h)`) or from outside."""
        reading = self._reading
        if reading is None or reading.scope is not owner:
            return bindings
        earlier = [b for b in bindings if b.order < reading.order]
        if not any(b.loop is reading.loop for b in earlier):
            return bindings
        if reading.loop is None:
            return earlier
        return [b for b in earlier if loop_within(b.loop, reading.loop)]

    def _binding_value_kind(self, binding: Binding, depth: int) -> Kind:
        value, scope = binding.value, binding.scope
        if binding.kind in ("value", "augment"):
            kind = self.kind(value, scope, depth)
            if kind is Kind.UNKNOWN and binding.kind == "value" and self._indexed_sample(value, binding.loop):
                return Kind.HOST_TENSOR  # `data = dataset[i]` in a step loop over `range(len(dataset))`
            if (
                binding.kind == "value"
                and (kind is Kind.UNKNOWN or (kind is Kind.NOT_TENSOR and next_of(value) is None))
                and self._draws_batch(value, binding.loop)
            ):
                # `data = loader.get_batch("train")` in a step loop: the batch, on the host, whatever
                # container holds it (a dict of arrays and tensors is "no tensor" as a whole). Not what
                # `next(fetcher)` hands back when that says more: a fetcher may move the batch itself.
                return Kind.HOST_TENSOR
            return kind
        if binding.kind == "element":
            if isinstance(value, cst.Call):
                returned = self.returned_kinds(value, scope, depth)
                if returned is not None and binding.position + 1 < len(returned):
                    return returned[binding.position + 1]  # `loss, parts = compute_loss(...)`: that element
            if _is_shape(value):
                return Kind.NOT_TENSOR  # `n, c, h, w = img.shape`: sizes
            inner = self.kind(value, scope, depth)
            if inner is Kind.UNKNOWN and self._draws_batch(value, binding.loop):
                return Kind.HOST_TENSOR
            # `logits, loss = model(x, y)`, `x, y = batch`: elements of tensors' containers are tensors.
            return inner if inner in (Kind.TENSOR, Kind.HOST_TENSOR) else Kind.UNKNOWN
        if binding.kind == "loop":
            kind = self._loop_element_kind(value, scope, binding.position, depth)
            # (the loop's own target: a comprehension inside a step loop walks something else)
            own_target = (
                binding.loop is not None
                and isinstance(binding.loop.node, cst.For)
                and (value is binding.loop.node.iter or self._contains.holds(binding.loop.node.iter, value))
            )
            if own_target and id(binding.loop) in self.steps.device_placed_loops():
                return Kind.TENSOR  # the iterator put the batch on the device itself
            if kind is Kind.UNKNOWN and own_target and self._yields_batches(binding.loop):
                return Kind.HOST_TENSOR
            return kind
        return Kind.UNKNOWN

    def _draws_batch(self, value: cst.BaseExpression, loop: LoopInfo | None) -> bool:
        """`batch, cond = next(self.data)` in a step loop that trains: whatever the iterator is
        called, each pass draws the step's batch from it (consistency models' `run_loop`). A call
        named for it draws one in any step loop, training or evaluating (`data =
        loader.get_batch(split)`, self-critical.pytorch's loader)."""
        if loop is None or not self.steps.is_step_loop(loop):
            return False
        if isinstance(value, cst.Call) and next_of(value) is None and _fetches_by_name(value):
            return True
        iterator = next_of(value)
        if iterator is None or _NOT_BATCHES.search(terminal_name(iterator) or ""):
            return False
        return self.steps.loop_trains(loop)

    def _indexed_sample(self, value: cst.BaseExpression, loop: LoopInfo | None) -> bool:
        """`dataset[i]` where the step loop walks `dataset` by index (stepmodel.walks_data): a sample
        read on the host."""
        if loop is None or not isinstance(value, cst.Subscript) or not isinstance(loop.node, cst.For):
            return False
        if not (self.steps.walks_data(loop) and self.steps.is_step_loop(loop)):
            return False
        walked = dotted_name(value.value)
        return walked is not None and walked == indexed_walk(loop)

    def _yields_batches(self, loop: LoopInfo | None) -> bool:
        """A `for` step loop over something that is not a count yields batches, whatever the
        iterable is called: MDM's `for motion, cond in tqdm(self.data): ... self.run_step(motion, cond)`
        iterates a loader handed to the constructor by another module."""
        if loop is None or not isinstance(loop.node, cst.For) or not self.steps.is_step_loop(loop):
            return False
        iterables = unwrap_iterable(loop.node.iter)
        # `for optim in optimizers: init_state(optim)` trains too, but over the things that train.
        return bool(iterables) and not any(_NOT_BATCHES.search(terminal_name(i) or "") for i in iterables)

    def _loop_element_kind(self, iterable: cst.BaseExpression, scope: Scope, position: int, depth: int = 6) -> Kind:
        wrapper = terminal_name(iterable.func) if isinstance(iterable, cst.Call) else None
        if wrapper in ("zip", "enumerate"):
            args = _call_arguments(iterable)
            if wrapper == "enumerate":
                if position == 0:
                    return Kind.NOT_TENSOR  # the index
                return self._loop_element_kind(args[0], scope, 0, depth) if args else Kind.UNKNOWN
            # zip(loader, range(a, b)): element i comes from the i-th iterable.
            return self._loop_element_kind(args[position], scope, 0, depth) if position < len(args) else Kind.UNKNOWN
        if wrapper in ("range", "trange"):
            return Kind.NOT_TENSOR
        # (a wrapper is a call's: `iterable` is a cst.Call below)
        if wrapper in _PARAMETER_ITERATORS and isinstance(cast(cst.Call, iterable).func, cst.Attribute):
            # `for p in model.parameters()`, `for name, p in model.named_parameters()`: where the model is.
            wanted = position == 1 if wrapper.startswith("named_") else position == 0
            return Kind.TENSOR if wanted else Kind.NOT_TENSOR
        if wrapper in ("items", "values") and isinstance(cast(cst.Call, iterable).func, cst.Attribute):
            # `for k, v in batch.items()`: the values of a batch dict are where the batch is.
            container = self.kind(cast(cst.Attribute, cast(cst.Call, iterable).func).value, scope, depth)
            wanted = position == 1 if wrapper == "items" else position == 0
            if wanted and container in (Kind.TENSOR, Kind.HOST_TENSOR):
                return container
            return Kind.UNKNOWN
        if self.steps.is_loader(iterable, scope) or any(
            self.steps.is_loader(inner, scope) for inner in _call_arguments(iterable)
        ):
            # A DataLoader yields host tensors (pinned or not); the script moves them to the device.
            return Kind.HOST_TENSOR
        if isinstance(iterable, cst.Name) and self._batch_part_on_host(iterable, scope, depth):
            # `for image in images` where `images` is (part of) a batch still on the host.
            return Kind.HOST_TENSOR
        if self.kind(iterable, scope, depth) is Kind.HOST_TENSOR:
            return Kind.HOST_TENSOR  # the rows of a host tensor (or the items of a list of them)
        if isinstance(iterable, cst.Name):
            return self._written_list_kind(iterable, scope, depth)
        return Kind.UNKNOWN

    def _written_list_kind(self, iterable: cst.Name, scope: Scope, depth: int) -> Kind:
        """`for _ in tmp` after `tmp = [data["fc_feats"], data["labels"]]` (self-critical.pytorch): the
        items of a list written out are its elements; a comprehension rebinding the name from itself
        (`tmp = [_.cuda() for _ in tmp]`) keeps what it walks."""
        found = scope.lookup(iterable.value)
        if not found or depth > 8:
            return Kind.UNKNOWN
        written = [b for b in found[0] if b.kind == "value" and isinstance(b.value, (cst.List, cst.Tuple))]
        rebuilt = [
            b
            for b in found[0]
            if b.kind == "value"
            and isinstance(b.value, (cst.ListComp, cst.GeneratorExp))
            and self._contains.holds(b.value, iterable)
        ]
        if not written or len(written) + len(rebuilt) != len(found[0]):
            return Kind.UNKNOWN
        return _merge(
            [
                self.kind(element.value, b.scope, depth + 1)
                for b in written
                for element in cast("cst.List | cst.Tuple", b.value).elements[:6]
                if not isinstance(element, cst.StarredElement)
            ]
        )

    def _batch_part_on_host(self, iterable: cst.Name, scope: Scope, depth: int = 6) -> bool:
        """Is the name iterated here bound only by loops and unpacking to host tensors? A binding
        whose own value holds this loop does not count: in `images = [i.to(device) for i in images]`
        the comprehension still reads the batch from the loader, not the moved list."""
        found = scope.lookup(iterable.value)
        if found is None or not found[0]:
            return False
        reaching = [b for b in found[0] if not self._contains.holds(b.value, iterable)]
        if not reaching or any(b.kind not in ("loop", "element") for b in reaching):
            return False
        if len(reaching) == len(found[0]):
            return self.kind(iterable, scope, depth) is Kind.HOST_TENSOR
        return _merge([self._binding_kind(b, depth) for b in reaching]) is Kind.HOST_TENSOR

    # --- attributes, subscripts ----------------------------------------------------------------

    def _kind_Attribute(self, expr: cst.Attribute, scope: Scope, depth: int) -> Kind:
        attr = expr.attr.value
        if attr in _NON_TENSOR_ATTRIBUTES:
            return Kind.NOT_TENSOR
        if self.index.imports.qualify(expr) is not None:
            return Kind.NOT_TENSOR  # `math.pi`, `torch.float16`, `np.inf`
        if attr in {"data", "T", "mT", "grad", "real", "imag"}:
            return self.kind(expr.value, scope, depth - 1)
        if isinstance(expr.value, cst.Name) and expr.value.value == "self":
            return self._self_attribute_kind(attr, scope, depth)
        if attr in _TENSOR_ATTRIBUTES:
            return Kind.TENSOR
        receiver = self.kind(expr.value, scope, depth - 1)
        if receiver is Kind.HOST_TENSOR:
            return Kind.HOST_TENSOR  # a field of a batch still on the host: torchtext's `batch.src`
        if receiver is Kind.TENSOR and attr not in _COUNT_ATTRIBUTES and not attr.startswith(("is_", "has_", "num_")):
            # A field of a batch object moved to the device (`batch = batch.to(device)`; PyG's
            # `batch.batch`, `batch.y`): the move took its tensors along.
            return Kind.TENSOR
        return Kind.UNKNOWN

    def _self_attribute_kind(self, attr: str, scope: Scope, depth: int) -> Kind:
        """`self.tokens` is a tensor when the class assigns it one (`self.tokens += (y >= 0).sum()`)."""
        owner = scope.owner_class
        if owner is not None and attr in owner.buffers:
            return Kind.TENSOR  # a registered buffer moves to the device with its module
        bindings = owner.attributes.get(attr) if owner is not None else None
        if not bindings:
            return Kind.UNKNOWN
        key = (id(owner), "self." + attr)
        if key in self._busy:
            return Kind.UNKNOWN
        self._busy.add(key)
        try:
            return _merge([self._binding_kind(binding, depth) for binding in bindings])
        finally:
            self._busy.discard(key)

    def _kind_Subscript(self, expr: cst.Subscript, scope: Scope, depth: int) -> Kind:
        inner = self.kind(expr.value, scope, depth - 1)
        if (
            inner is not Kind.TENSOR
            and isinstance(expr.value, cst.Name)
            and self._moved_in_place(expr.value, scope, depth)
        ):
            return Kind.TENSOR  # `for key, val in meta.items(): meta[key] = val.cuda()` ... `meta["boxes"]`
        return inner if inner in (Kind.TENSOR, Kind.HOST_TENSOR) else Kind.UNKNOWN

    def _moved_in_place(self, container: cst.Name, scope: Scope, depth: int) -> bool:
        """Does the function write device tensors into the container's elements (`meta[key] =
        val.cuda(non_blocking=True)`, `inputs[i] = inputs[i].cuda()`)?"""
        found = scope.lookup(container.value)
        owner = found[1] if found is not None else None
        return any(
            where is owner
            and isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("cuda", "to")
            and self.kind(value, where, depth + 1) is Kind.TENSOR
            for value, where in self.index.element_writes.get(container.value, ())
        )

    # --- operators -----------------------------------------------------------------------------

    def _kind_BinaryOperation(self, expr: cst.BinaryOperation, scope: Scope, depth: int) -> Kind:
        if isinstance(expr.operator, cst.Modulo) and isinstance(expr.left, (cst.SimpleString, cst.ConcatenatedString)):
            return Kind.NOT_TENSOR  # "%.3f" % x is a string
        return _merge([self.kind(expr.left, scope, depth), self.kind(expr.right, scope, depth)])

    def _kind_UnaryOperation(self, expr: cst.UnaryOperation, scope: Scope, depth: int) -> Kind:
        if isinstance(expr.operator, cst.Not):
            return Kind.NOT_TENSOR  # `not t` is a bool (the truth value itself is the sync)
        return self.kind(expr.expression, scope, depth)

    def _kind_Comparison(self, expr: cst.Comparison, scope: Scope, depth: int) -> Kind:
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in expr.comparisons):
            return Kind.NOT_TENSOR
        operands = [expr.left, *(c.comparator for c in expr.comparisons)]
        if any(
            isinstance(operand, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)) for operand in operands
        ):
            return Kind.NOT_TENSOR  # `mode == "train"`: tensors are never compared with strings
        return _merge([self.kind(operand, scope, depth) for operand in operands])

    def _kind_BooleanOperation(self, expr: cst.BooleanOperation, scope: Scope, depth: int) -> Kind:
        return _merge([self.kind(expr.left, scope, depth), self.kind(expr.right, scope, depth)])

    def _kind_IfExp(self, expr: cst.IfExp, scope: Scope, depth: int) -> Kind:
        return _merge([self.kind(expr.body, scope, depth), self.kind(expr.orelse, scope, depth)])

    # --- calls ---------------------------------------------------------------------------------

    def returned_kinds(self, call: cst.Call, scope: Scope, depth: int) -> tuple[Kind, ...] | None:
        """What a call of a project function returns: (the whole, then each element when every
        `return` gives a tuple of the same length), from the function's own `return` statements when
        it is in this module, from the project index when it is in another; None when unknown."""
        site = self.steps.call_site(call)
        if site is None:
            return None
        functions = self.steps.resolve(site)
        if functions:
            returned = self._local_returns(functions, depth)
            if (
                returned is not None
                and (Kind.TENSOR in returned or Kind.UNKNOWN in returned)
                and self._host_in_host_out(call, functions, scope, depth)
            ):
                # `coords = get_preds(score_map.cpu())`, `weights = cubic(distance)`: this call hands it host
                # tensors only, and it moves nothing to the device itself, so what it returns is on the
                # host here (what it computes from its parameters as well as what it makes)
                return tuple(Kind.HOST_TENSOR if kind in (Kind.TENSOR, Kind.UNKNOWN) else kind for kind in returned)
            return returned
        facts = self.steps.facts
        if facts is None or not facts.return_kinds:
            return None
        target = self.steps.external_target(site)
        for name, kinds in facts.return_kinds:
            if name == target:
                return tuple(Kind(kind) for kind in kinds)
        return None

    def _host_in_host_out(self, call: cst.Call, functions: list[FunctionInfo], scope: Scope, depth: int) -> bool:
        """Does this call hand the function host tensors only (one at least), and does the function
        compute with torch alone, never putting anything on the device (no move, no `device=`, no
        model, no call into other code)?"""
        if depth > 8 or any(arg.star for arg in call.args):
            return False
        if not all(self._computes_in_place(function) for function in functions):
            return False  # (asked first: once per function, where the arguments' kinds are per call)
        kinds = [self.kind(arg.value, scope, depth) for arg in call.args]
        return Kind.HOST_TENSOR in kinds and Kind.TENSOR not in kinds

    def _computes_in_place(self, function: FunctionInfo) -> bool:
        key = id(function)
        if key not in self._in_place:
            self._in_place[key] = all(
                self._keeps_device(site.call) or _typed_as_local(site.call, function) for site in function.all_calls
            )
        return self._in_place[key]

    def _keeps_device(self, call: cst.Call) -> bool:
        """A call that leaves tensors where they are: a torch function without `device=`, a tensor
        method other than a move, or a Python builtin."""
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in call.args):
            return False
        func = call.func
        qualified = self.index.imports.qualify(func) or ""
        if qualified.startswith("torch.") and not qualified.startswith(("torch.cuda", "torch.nn")):
            return True
        if isinstance(func, cst.Name):
            return func.value in _PY_NON_TENSOR_CALLS or func.value in ("max", "min", "zip", "enumerate", "sum")
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            return (method in _TENSOR_METHODS or method in _SHAPE_METHODS) and method not in (
                "to",
                "cuda",
                "type",
                "type_as",
                "new",
            )
        return False

    def _local_returns(self, functions: list[FunctionInfo], depth: int) -> tuple[Kind, ...] | None:
        results = []
        for function in functions:
            key = (id(function), "<return>")
            if key in self._busy or not function.returns or function.node.asynchronous is not None:
                return None
            self._busy.add(key)
            try:
                results.append(self.function_returns(function, depth + 2))
            finally:
                self._busy.discard(key)
        if len({len(r) for r in results}) != 1:
            return (_merge([r[0] for r in results]),)
        return tuple(_merge(list(kinds)) for kinds in zip(*results))

    def function_returns(self, function: FunctionInfo, depth: int = 0) -> tuple[Kind, ...]:
        """(whole, element 0, element 1, ...) for what `function` returns (see `returned_kinds`)."""
        cached = self._returns.get(id(function))
        if cached is None:
            cached = self._returns[id(function)] = self._function_returns(function, depth)
        return cached

    def _function_returns(self, function: FunctionInfo, depth: int) -> tuple[Kind, ...]:
        if function.is_generator:
            return (Kind.UNKNOWN,)  # a generator returns its iterator
        returns = function.node.returns
        if returns is not None and _NON_TENSOR_ANNOTATION.match(self.index.module.code_for_node(returns.annotation)):
            return (Kind.NOT_TENSOR,)  # `def get_cycles_per_ms() -> float:`
        with self._names_not_guessed():
            return self._returned_by(function, depth)

    def _returned_by(self, function: FunctionInfo, depth: int) -> tuple[Kind, ...]:
        values = function.returns
        whole = _merge([self.kind(value, function.scope, depth) for value in values])
        sizes = {len(value.elements) if isinstance(value, cst.Tuple) else -1 for value in values}
        if len(sizes) != 1 or -1 in sizes:
            return (whole,)
        elements = [
            _merge([self.kind(cast(cst.Tuple, value).elements[i].value, function.scope, depth) for value in values])
            for i in range(sizes.pop())
        ]
        return (_merge(elements), *elements)

    def _kind_Call(self, expr: cst.Call, scope: Scope, depth: int) -> Kind:
        func = expr.func
        qualified = self.index.imports.qualify(func)
        if qualified is not None and not qualified.startswith(("torch.", "numpy.")) and qualified != "torch":
            returned = self.returned_kinds(expr, scope, depth)
            if returned is not None:
                return returned[0]
        if qualified is not None:
            return self._library_call_kind(qualified, expr, scope, depth)
        iterator = next_of(expr, scope)
        if iterator is not None and self.steps.is_loader(iterator, scope):
            return Kind.HOST_TENSOR  # `batch = next(train_iter)`, `train_iter.next()`: a batch as the loader yields it
        if isinstance(func, cst.Name):
            if func.value in _PY_NON_TENSOR_CALLS:
                return Kind.NOT_TENSOR
            if func.value in self.index.classes:
                return Kind.UNKNOWN  # constructing one of the module's own classes
            if calls_a_model(func.value) or self._is_model_instance(func.value, scope):
                return Kind.TENSOR
            returned = self.returned_kinds(expr, scope, depth)
            return returned[0] if returned is not None else Kind.UNKNOWN
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _NON_TENSOR_METHODS:
                return Kind.NOT_TENSOR
            if method == "get" and _SETTINGS_NAME.search(terminal_name(func.value) or ""):
                return Kind.NOT_TENSOR  # `eval_kwargs.get('verbose_loss', 1)`: a setting, whatever it is called
            if method in _TENSOR_METHODS or method in _CONTAINER_METHODS:
                receiver = self.kind(func.value, scope, depth - 1)
                if receiver not in (Kind.TENSOR, Kind.HOST_TENSOR):
                    return receiver if method in _TENSOR_METHODS else Kind.UNKNOWN
                if method in _TO_HOST:
                    return Kind.HOST_TENSOR
                if method in _TO_DEVICE and not _moves_to_cpu(expr) and not self._converts_dtype(expr, scope):
                    return Kind.TENSOR
                return receiver
            if isinstance(func.value, cst.Name) and func.value.value == "self" and calls_a_model(method):
                return Kind.TENSOR  # `self.model(x)`, `self.criterion(out, y)`
            returned = self.returned_kinds(expr, scope, depth)
            return returned[0] if returned is not None else Kind.UNKNOWN
        return Kind.UNKNOWN

    def _converts_dtype(self, call: cst.Call, scope: Scope) -> bool:
        """`x.to(torch.float16)`, `x.to(dtype=torch.long)`, or `x.to(dtype)` after `dtype = torch.float64`:
        a dtype conversion, which leaves the tensor where it is."""
        if cast(cst.Attribute, call.func).attr.value != "to" or len(call.args) != 1:  # (a method call's)
            return False
        arg = call.args[0]
        if arg.star or (arg.keyword is not None and arg.keyword.value != "dtype"):
            return False
        return self._is_dtype(arg.value, scope)

    def _is_dtype(self, expr: cst.BaseExpression, scope: Scope, depth: int = 0) -> bool:
        if isinstance(expr, cst.Attribute):
            qualified = self.index.imports.qualify(expr) or ""
            return qualified.count(".") == 1 and qualified[6:] in TORCH_DTYPES and qualified.startswith("torch.")
        if isinstance(expr, cst.Name) and depth < 2:
            found = scope.lookup(expr.value)
            values = [b.value for b in found[0] if b.kind == "value"] if found else []
            return (
                bool(values)
                and len(values) == len(cast("tuple[list[Binding], Scope]", found)[0])
                and all(self._is_dtype(v, scope, depth + 1) for v in values)
            )
        return False

    def _library_call_kind(self, qualified: str, call: cst.Call, scope: Scope, depth: int) -> Kind:
        root = qualified.split(".")[0]
        if root in {"numpy", "math", "time", "random", "os", "sys", "json", "pandas", "statistics"}:
            return Kind.NOT_TENSOR
        if root != "torch":
            return Kind.UNKNOWN
        if qualified.startswith(_TORCH_NON_TENSOR_PREFIXES) or _TORCH_NON_TENSOR_FUNCTIONS.match(qualified):
            return Kind.NOT_TENSOR
        if any(part.startswith("__") for part in qualified.split(".")):
            return Kind.NOT_TENSOR  # `torch.__version__.startswith("0.4")`: the module's metadata, a string
        last = qualified.rsplit(".", 1)[-1]
        if last == "Variable":  # torch.autograd.Variable(x): x itself since torch 0.4
            first = next((arg.value for arg in call.args if arg.keyword is None), None)
            return self.kind(first, scope, depth) if first is not None else Kind.UNKNOWN
        if last[:1].isupper() and not last.endswith("Tensor"):
            return Kind.NOT_TENSOR  # constructing an object: SummaryWriter, GradScaler, Linear
        if qualified.count(".") == 1 and last.endswith("Tensor"):
            return Kind.HOST_TENSOR  # `torch.FloatTensor(x)`: the legacy constructors build on the host
        if qualified.count(".") == 1 and last in _TORCH_CREATION:
            device = next((a.value for a in call.args if a.keyword and a.keyword.value == "device"), None)
            if device is None or _is_cpu_literal(device):
                return Kind.HOST_TENSOR
            if isinstance(device, cst.Attribute) and device.attr.value == "device":
                # `torch.zeros(n, device=x.device)`: wherever x is.
                where = self.kind(device.value, scope, depth)
                return where if where in (Kind.TENSOR, Kind.HOST_TENSOR) else Kind.UNKNOWN
            return Kind.TENSOR
        # Other functions compute where their inputs live: torch.isnan(loss) is where loss is.
        inputs = [self._input_kind(arg.value, scope, depth) for arg in call.args if arg.keyword is None][:3]
        if Kind.HOST_TENSOR in inputs and Kind.TENSOR not in inputs:
            return Kind.HOST_TENSOR
        return Kind.TENSOR

    def _input_kind(self, expr: cst.BaseExpression, scope: Scope, depth: int) -> Kind:
        """Where an argument of a torch function lives; `torch.cat((x, v))` reads the tuple's tensors."""
        if isinstance(expr, (cst.Tuple, cst.List)) and expr.elements:
            return _merge([self.kind(element.value, scope, depth) for element in expr.elements[:4]])
        return self.kind(expr, scope, depth)

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


# Collections a training loop may walk that hold no batches: optimizers, models, parameter groups.
_NOT_BATCHES = re.compile(r"optim|sched|model|net|param|module|layer|loss|metric|callback|hook|group", re.I)


def _literal_default(name: str, scope: Scope) -> bool:
    """Is parameter `name` of the scope's function given a literal default (`None`, a number, a
    string)? Such a parameter is a setting, whatever it is called."""
    default = param_default(scope.function, name)
    return isinstance(default, (cst.Integer, cst.Float, cst.BaseString)) or (
        isinstance(default, cst.Name) and default.value in ("None", "True", "False")
    )


def _is_shape(expr: cst.BaseExpression) -> bool:
    """`x.shape`, `x.size()`, `x.shape[:2]`: a tuple of sizes."""
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "shape"
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "size"
        and not expr.args
    )


# Helpers that move the tensors handed to them to the device: XLM's `to_cuda(*args)`, `to_device(batch, device)`.
_MOVER = re.compile(r"(?i)^_?(to_?cuda|to_?device|to_?gpu|move_to(_device)?|send_to_device|batch_to_device)$")


def _moves_name(binding: Binding, name: str) -> bool:
    """Is the binding `name, ... = to_cuda(name, ...)`: a batch helper moving the name's tensors? (Not
    `name = name.to(device)`, which moves models as often as tensors.)"""
    value = binding.value
    return (
        binding.kind == "element"
        and isinstance(value, cst.Call)
        and _MOVER.match(terminal_name(value.func) or "") is not None
        and any(isinstance(arg.value, cst.Name) and arg.value.value == name for arg in value.args)
    )


def _merge(kinds: list[Kind]) -> Kind:
    """What a value is when it may be any of `kinds` (several bindings, or operands combined)."""
    if Kind.TENSOR in kinds:
        return Kind.TENSOR  # mixing host and device tensors is only legal when the result is on the device
    if not kinds:
        return Kind.UNKNOWN
    if all(k is Kind.NOT_TENSOR for k in kinds):
        return Kind.NOT_TENSOR
    if Kind.HOST_TENSOR in kinds and all(k in (Kind.HOST_TENSOR, Kind.NOT_TENSOR) for k in kinds):
        return Kind.HOST_TENSOR
    return Kind.UNKNOWN


def _fetches_by_name(call: cst.Call) -> bool:
    """`loader.get_batch(split)`, `get_batch("train")`: a call named for fetching a batch (not `.next()`,
    whose receiver says more: a prefetcher moves the batch to the device itself)."""
    name = terminal_name(call.func) or ""
    if name == "next" or not BATCH_FETCH.match(name):
        return False
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    return receiver is None or not _NOT_BATCHES.search(terminal_name(receiver) or "")


def _typed_as_local(call: cst.Call, function: FunctionInfo) -> bool:
    """`(absx <= 1).type_as(absx)`: a conversion to the type, and device, of one of the function's own
    values (a parameter or a name it binds), which are where its arguments are."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "type_as" and len(call.args) == 1):
        return False
    other = call.args[0].value
    if not isinstance(other, cst.Name):
        return False
    found = function.scope.lookup(other.value)  # (a parameter is found in the function's own scope too)
    return found is not None and found[1] is function.scope


def _is_cpu_literal(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.SimpleString) and expr.value.strip("'\"") == "cpu"


def _constructs_object(func: cst.BaseExpression) -> bool:
    """`AverageMeter()`, `utils.Logger(...)`: a call of a class by Python's naming convention, which
    makes an object; not `Variable(x)` or `Parameter(x)` (tensors), nor a `FloatTensor`."""
    name = terminal_name(func) or ""
    return looks_like_class(name) and not name.endswith("Tensor") and name not in ("Variable", "Parameter")


def _moves_to_cpu(call: cst.Call) -> bool:
    target = call.args[0].value if call.args and call.args[0].keyword is None else None
    return target is not None and _is_cpu_literal(target)


def _call_arguments(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.Call):
        return [arg.value for arg in expr.args if arg.keyword is None]
    return []
