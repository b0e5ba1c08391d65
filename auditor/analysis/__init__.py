"""The analysis model: what the scanned code is, which of it runs once per training step, and which
values live on the device.

- `module_index`: the one walk over a file (scopes, bindings, loops, frames of code, call edges).
- `stepmodel`: the per-step model: the project call graph walked from step loops, evaluation loops
  and framework hooks, each reached function keeping one shortest chain for its findings.
- `project`: the same facts across the modules of a project (imports, classes, settings, devices).
- `options`: the arms of code a parameter's or setting's value selects (`if skip_type == 'logSNR':`).
- `tensors` and `device`: device provenance, i.e. which values are tensors and where they live.
- `names`, `walk`, `patterns`, `constants`: the vocabulary the others share.

Rules use this package through the names below and the `RuleContext` members (`ctx.index`,
`ctx.steps`, `ctx.tensors`), never through a module's private members: `tests/test_rule_api.py`
keeps it so.
"""

from loopaudit.analysis.argument_values import (
    CPU_COUNT,
    UNKNOWN,
    command_line_default,
    constant,
    counts_cpus,
    setting_value,
)
from loopaudit.analysis.distributed import DDP_CLASSES, collective_of, is_computation
from loopaudit.analysis.module_index import FrameKind, LoopInfo, ModuleIndex, Scope, argument_for
from loopaudit.analysis.names import dotted_name, target_names, terminal_name
from loopaudit.analysis.patterns import (
    BATCH_FETCH,
    EVALUATION_FUNCTION,
    FORWARD_CALLEE,
    TORCH_CONVERSIONS,
    TORCH_FACTORIES,
    is_inference_method,
    is_training_call,
    next_of,
    runs_a_model,
    type_test,
    unwrap_iterable,
)
from loopaudit.analysis.stepmodel import StepModel, drawn_from
from loopaudit.analysis.tensors import Kind, TensorInference
from loopaudit.analysis.walk import holds, iter_subtree

__all__ = [
    "BATCH_FETCH",
    "CPU_COUNT",
    "DDP_CLASSES",
    "EVALUATION_FUNCTION",
    "FORWARD_CALLEE",
    "TORCH_CONVERSIONS",
    "TORCH_FACTORIES",
    "UNKNOWN",
    "FrameKind",
    "Kind",
    "LoopInfo",
    "ModuleIndex",
    "Scope",
    "StepModel",
    "TensorInference",
    "argument_for",
    "collective_of",
    "command_line_default",
    "constant",
    "counts_cpus",
    "dotted_name",
    "drawn_from",
    "holds",
    "is_computation",
    "is_inference_method",
    "is_training_call",
    "iter_subtree",
    "next_of",
    "runs_a_model",
    "setting_value",
    "target_names",
    "terminal_name",
    "type_test",
    "unwrap_iterable",
]
