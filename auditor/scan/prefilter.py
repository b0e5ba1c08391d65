"""A text check that rules a file out before it is parsed.

Parsing is most of a scan's cost (libcst builds a full syntax tree), and in a large repository most
Python files cannot contain a finding: they never mention torch, or contain no loop and no step hook.
This check runs in microseconds and errs on the side of parsing. It applies to files found by walking
folders; files named on the command line are always parsed, so their syntax errors are reported.
"""

from __future__ import annotations

import re

# What a step loop or step hook needs to exist (see stepmodel.py), each on a line of code (not a
# comment or a `>>>` docstring example): a training call (`.backward(`, `autograd.grad(`, or `.step(` on anything but
# a scheduler: `scheduler.step(...)` trains nothing, and every diffusers pipeline calls one); a `for`
# over a loader; a DataLoader; a framework hook; a counted loop over `range` (also inside
# `enumerate(...)` or `tqdm(...)`: a loop over `enumerate(timesteps)` counts nothing) whose variable
# or bound counts steps; a `while` whose test counts steps; or a `while True:` in a file that fetches
# batches.
_DATA_LOADER = re.compile(r"\bDataLoader\b")
_HOOKS = (
    "training_step",
    "validation_step",
    "test_step",
    "predict_step",
    "compute_loss",
    "prediction_step",
    "on_train_batch_end",
    "on_train_batch_start",
    "on_step_end",
)
_HOOK = re.compile(r"\b(?:" + "|".join(_HOOKS) + r")\b")
_STEP_LOOP = re.compile(
    r"^[ \t]*(?:async[ \t]+)?for\b[^\n]*\bin\b[^\n]*(?:[lL]oader|_dl\b|\bdl\b|data_?iter|prefetcher|"
    r"\b(?:train|val|valid|validation|test|eval|dev)_?iter(?:ator)?\b)|"
    r"^[ \t]*for\b[^\n]*\bin[ \t]+(?:(?:tqdm|enumerate)\([^\n]*)?t?range\([^\n]*(?:steps?\b|iters?\b|iterations\b|batches\b|iter_num)|"
    r"^[ \t]*for[ \t]+(?:step|it|iter|iteration|global_step|batch_?idx|\w+_step)[ \t]+in[ \t]+(?:range|trange)\(|"
    r"^[ \t]*while\b[^\n]*(?:steps\b|iters\b|max_iter|iterations\b|iter_?num|global_step|batches\b|updates\b)",
    re.M,
)
# A walk over data that is no DataLoader (stepmodel.walks_data): a dataset by index, a list of files,
# or a generator function of the file (`_walks_own_generator`); only with a sign of inference in the
# file (`torch.no_grad()`, `model.eval()`): libraries walk paths and generators for other reasons.
_DATA_WALK = re.compile(
    r"^[ \t]*for\b[^\n]*\bin[ \t]+(?:(?:tqdm|enumerate)\()*range\(len\((?:self\.)?\w*(?:dataset|data_set|_set|samples|data)\)|"
    r"^[ \t]*for\b[^\n]*\bin[ \t]+(?:(?:tqdm|enumerate)\()*(?:file_?list|files|filenames|file_?names|paths|image_?paths|img_?list|image_?list|wav_?list|video_?list|samples)\b",
    re.M,
)
# A generator function (`def datagen(...): ... yield batch`) that a loop of the same file walks.
# `for i in range(0, len(images), batch_size)`: a walk over data one batch at a time (stepmodel.batch_stride).
_BATCH_STRIDE = re.compile(
    r"^[ \t]*for\b[^\n]*\bin[ \t]+(?:(?:tqdm|enumerate)\()*range\([^\n]*,[^\n,]*(?:batch_?size|\bbsz?\b)[^\n,]*\)", re.M
)
_YIELD = re.compile(r"^[ \t]+yield\b", re.M)
# A loop, and a call of something named like a model (`model(x)`, `self.net(x)`), in a file that turns
# autograd off: an evaluation loop over items of any kind.
_FOR_LOOP = re.compile(r"^[ \t]*for\b[^\n]*\bin\b", re.M)
# A call that reads an image, an array or a recording from a file (stepmodel._FILE_READER, less `open`,
# `load` and `read`, which every file uses for other things).
_FILE_READ = re.compile(
    r"\b(?:imread\w*|read_image|read_video|load_image|load_img|loadmat|load_wav|read_wav)\(|"
    r"\b(?:Image\.open|np\.load|numpy\.load|sf\.read|soundfile\.read|torchaudio\.load|librosa\.load)\("
)
_FORWARD_CALL = re.compile(r"(?<![\w.])(?:self\.)?\w*(?:model|net|network)[ \t]*\(", re.I)
_DEF = re.compile(r"^[ \t]*def[ \t]+(\w+)[ \t]*\(", re.M)


def _trains(text: str) -> bool:
    """`.backward(`, `autograd.grad(` or `.step(` on a line of code, the step's receiver not named like
    a scheduler. Found with str.find: a regular expression tried at every word of a large file costs more."""
    for needle in (".backward(", "autograd.grad(", ".step("):
        at = text.find(needle)
        while at >= 0:
            if _in_code(text, at) and (needle != ".step(" or not _names_a_scheduler(text, at)):
                return True
            at = text.find(needle, at + 1)
    return False


def _names_a_scheduler(text: str, dot: int) -> bool:
    """Is the name just before `text[dot]` (`lr_scheduler` in `lr_scheduler.step(`) a scheduler's?"""
    start = dot
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return "sched" in text[start:dot].lower()


def _in_code(text: str, offset: int) -> bool:
    """Is the line of `offset` code, rather than a comment or a `>>>` example in a docstring?"""
    before = text[text.rfind("\n", 0, offset) + 1 : offset].lstrip(" \t")
    return not before or not (before[0] in "#>" or before[0].isspace())


def _has_step_hint(text: str) -> bool:
    """Each pattern runs only where a plain substring test (C speed) says it can match: a scan of
    a large repository runs this on every file."""
    if _trains(text):
        return True
    if "DataLoader" in text and _DATA_LOADER.search(text):
        return True
    if any(hook in text for hook in _HOOKS) and _HOOK.search(text):
        return True
    if _STEP_LOOP.search(text) is not None:
        return True
    if "cuda" in text and _BATCH_STRIDE.search(text) is not None:
        return True  # `for i in range(0, n, batch_size): ... .cuda()`: inference one batch at a time
    if (
        _FILE_READ.search(text) is not None
        and _FOR_LOOP.search(text) is not None
        and _FORWARD_CALL.search(text) is not None
    ):
        return True  # a loop that may read one file per item and run a model on it (stepmodel._reads_item_files)
    if not ("no_grad" in text or "inference_mode" in text or ".eval()" in text):
        return False
    if _DATA_WALK.search(text) is not None:
        return True
    if _FOR_LOOP.search(text) is not None and _FORWARD_CALL.search(text) is not None:
        return True  # a loop that may run a model on each item with autograd off (stepmodel._runs_model_on_items)
    return "yield" in text and _YIELD.search(text) is not None and _walks_own_generator(text)


def _walks_own_generator(text: str) -> bool:
    """A call of a function the file defines (with a `yield` somewhere in the file), in a `for` or bound
    to a name a loop walks: `for x in datagen(frames, mels)`, `gen = datagen(...)`."""
    names = set(_DEF.findall(text))
    if not names:
        return False
    called = re.compile(r"^[ \t]*(?:for\b[^\n]*\bin\b|\w+[ \t]*=)[^\n]*\b(?:" + "|".join(sorted(names)) + r")\(", re.M)
    return called.search(text) is not None


_WHILE_TRUE = re.compile(r"^[ \t]*while[ \t]+True\b", re.M)
# `pbar = tqdm(loaders[0])`: a name bound to something wrapping a variable named like a data loader
# (`loaders`, `train_loader`, `dataloader`; not an import machinery's `spec.loader`).
_BOUND_TO_LOADER = re.compile(r"^[ \t]*(\w+)[ \t]*=[^=\n][^\n]*(?<![.\w])(?:\w+_|data|train|val|test)?loaders?\b", re.M)
_BATCH_SOURCE = re.compile(r"[lL]oader|get_batch|next_batch|fetch_batch|data_?iter|prefetcher")
# Everything device.py accepts as a sign of CUDA must pass here too.
_CUDA_HINT = re.compile(
    r"cuda|nccl|Accelerator|Fabric|Lightning|Trainer|DataParallel|Callback|(?:non_blocking|pin_memory)\s*=\s*True"
)


# A loader setting assigned at the top of a module: `workers = 4`, `NUM_WORKERS = 8`, `pin_memory = True`.
_LOADER_SETTING = re.compile(r"(?mi)^\w*(?:workers|pin_memory)\w*[ \t]*=[ \t]*(?:\d|True|False)")


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
    torch; its train.py never says "cuda"), so only the signs of step code count. A module the
    project needs whatever it holds (a model its steps call, every model of a project that trains
    on CUDA) is asked for by the project's facts instead (project.py)."""
    # A rule that reports outside any step (LA502's deprecated `torch.cuda.amp`) must see every file
    # that holds its text, in a project as much as alone: a model file with no step code of its own
    # is no exception.
    if any(re.search(hint, text) for hint in stepless_hints):
        return True
    if not in_project:
        if "torch" not in text:
            return False
        if only_cuda_rules and not _CUDA_HINT.search(text):
            return False
    if any(hook in text for hook in extra_hooks):
        return True
    if in_project and "add_argument" in text and "cuda" in text:
        return True  # a command line whose device defaults to CUDA (args.py): the project reads its defaults
    if in_project and _LOADER_SETTING.search(text) is not None:
        return True  # a settings module (config.py: `workers = 4`) that the loaders elsewhere read
    if _has_step_hint(text):
        return True
    # A `while True:` that fetches batches, or a loop over a name bound to a loader elsewhere in the
    # file (`pbar = tqdm(loaders[0])` ... `for x, y in pbar:`).
    # (Each pattern only where the words it needs are in the text: most files have neither.)
    if (
        "while" in text
        and "True" in text
        and _WHILE_TRUE.search(text) is not None
        and _BATCH_SOURCE.search(text) is not None
    ):
        return True
    return "loader" in text and any(
        re.search(rf"^[ \t]*for\b[^\n]*\bin\b[^\n]*\b{re.escape(match.group(1))}\b", text, re.M)
        for match in _BOUND_TO_LOADER.finditer(text)
    )
