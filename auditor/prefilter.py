"""A text check that rules a file out before it is parsed.

Parsing is most of a scan's cost (libcst builds a full syntax tree), and in a large repository most
Python files cannot contain a finding: they never mention torch, or contain no loop and no step hook.
This check runs in microseconds and errs on the side of parsing. It applies to files found by walking
folders; files named on the command line are always parsed, so their syntax errors are reported.
"""

from __future__ import annotations

import re

# What a step loop or step hook needs to exist (see stepmodel.py), each on a line of code (not a
# comment or a `>>>` docstring example): a training call (`.backward(`, or `.step(` on anything but
# a scheduler: `scheduler.step(...)` trains nothing, and every diffusers pipeline calls one); a `for`
# over a loader; a DataLoader; a framework hook; a counted loop over `range` (also inside
# `enumerate(...)` or `tqdm(...)`: a loop over `enumerate(timesteps)` counts nothing) whose variable
# or bound counts steps; a `while` whose test counts steps; or a `while True:` in a file that fetches
# batches.
_STEP_HINT = re.compile(
    r"^[ \t]*(?![#>\s])[^\n]*?(?:\.backward|(?<!\w)(?!\w*(?i:sched))\w+\.step|\)\.step)\(|"
    r"\bDataLoader\b|"
    r"\b(?:training_step|validation_step|test_step|predict_step|compute_loss|prediction_step|"
    r"on_train_batch_end|on_train_batch_start|on_step_end)\b|"
    r"^[ \t]*(?:async[ \t]+)?for\b[^\n]*\bin\b[^\n]*(?:[lL]oader|_dl\b|\bdl\b|data_?iter|prefetcher|"
    r"\b(?:train|val|valid|validation|test|eval|dev)_?iter(?:ator)?\b)|"
    r"^[ \t]*for\b[^\n]*\bin[ \t]+(?:(?:tqdm|enumerate)\([^\n]*)?t?range\([^\n]*(?:steps?\b|iters?\b|iterations\b|batches\b|iter_num)|"
    r"^[ \t]*for[ \t]+(?:step|it|iter|iteration|global_step|batch_?idx|\w+_step)[ \t]+in[ \t]+(?:range|trange)\(|"
    r"^[ \t]*while\b[^\n]*(?:steps\b|iters\b|max_iter|iterations\b|iter_?num|global_step|batches\b|updates\b)",
    re.M,
)
_MODULE_CLASS = re.compile(r"^class[ \t]+\w+[ \t]*\([^)\n]*\bModule\b", re.M)
_WHILE_TRUE = re.compile(r"^[ \t]*while[ \t]+True\b", re.M)
# `pbar = tqdm(loaders[0])`: a name bound to something wrapping a variable named like a data loader
# (`loaders`, `train_loader`, `dataloader`; not an import machinery's `spec.loader`).
_BOUND_TO_LOADER = re.compile(r"^[ \t]*(\w+)[ \t]*=[^=\n][^\n]*(?<![.\w])(?:\w+_|data|train|val|test)?loaders?\b", re.M)
_BATCH_SOURCE = re.compile(r"[lL]oader|get_batch|next_batch|fetch_batch|data_?iter|prefetcher")
# Everything device.py accepts as a sign of CUDA must pass here too.
_CUDA_HINT = re.compile(
    r"cuda|nccl|Accelerator|Fabric|Lightning|Trainer|DataParallel|Callback|(?:non_blocking|pin_memory)\s*=\s*True"
)


def may_contain_findings(
    text: str,
    *,
    only_cuda_rules: bool,
    extra_hooks: frozenset[str] = frozenset(),
    stepless_hints: tuple[str, ...] = (),
    in_project: bool = False,
) -> bool:
    """Could any enabled rule report something in `text`? `stepless_hints` are the text hints
    (regular expressions) of the enabled rules that can report outside any step loop.

    `in_project`: the file is one module of a project scanned together. Its torch import and its CUDA
    device may then be in another module (SPADE's trainer calls `loss.backward()` without importing
    torch; its train.py never says "cuda"), so only the signs of step code count."""
    if not in_project:
        if "torch" not in text:
            return False
        if any(re.search(hint, text) for hint in stepless_hints):
            return True
        if only_cuda_rules and not _CUDA_HINT.search(text):
            return False
    elif _MODULE_CLASS.search(text):
        return True  # the project's models: what other modules' steps call, and the classes they build
    if any(hook in text for hook in extra_hooks):
        return True
    if _STEP_HINT.search(text) is not None:
        return True
    # A `while True:` that fetches batches, or a loop over a name bound to a loader elsewhere in the
    # file (`pbar = tqdm(loaders[0])` ... `for x, y in pbar:`).
    if _WHILE_TRUE.search(text) is not None and _BATCH_SOURCE.search(text) is not None:
        return True
    return any(
        re.search(rf"^[ \t]*for\b[^\n]*\bin\b[^\n]*\b{re.escape(match.group(1))}\b", text, re.M)
        for match in _BOUND_TO_LOADER.finditer(text)
    )
