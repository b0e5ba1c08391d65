"""Project-wide analysis: the per-step model across the modules of one scan.

Real projects put the loop in train.py and the step in engine.py, models.py or utils.py. When a scan
covers several files, each file is still parsed and analysed on its own (in worker processes), but
its analysis also yields a small, picklable `ModuleSummary` (cross_module.py). From all the summaries,
`derive_facts` computes each module's `ProjectFacts`: the functions of other modules its calls enter
that train (so its loop is a step loop), the functions of its own that other modules call once per
step (and from where), and whether a CUDA module drives it. A module whose facts changed is analysed
again with them; a few rounds (`MAX_ROUNDS`) settle the longest call chains. A file scanned alone gets
no facts and keeps the single-file behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from loopaudit.analysis.cross_module import CallEdge, ModuleSummary, ProjectFacts
from loopaudit.analysis.layout import ProjectLayout
from loopaudit.analysis.module_index import STAR_KWARGS, Signature

if TYPE_CHECKING:
    # path -> (edge, file, qualname) for each of its calls that enters another scanned module (_resolved_edges)
    _Resolved = dict[str, list[tuple[CallEdge, str, str]]]

MAX_ROUNDS = 10  # each round settles one more link of a cross-module call chain
# A function is per-step when a per-step line calls it from at most this many modules away: training
# code reaches its step through a few of its own modules (train.py -> engine.py -> utils.py), while
# following every call on into a library scanned with it would mark the whole library per-step.
MAX_HOPS = 3


def derive_facts(
    layout: ProjectLayout, summaries: dict[str, ModuleSummary], unanalysable: Iterable[str] = ()
) -> dict[str, ProjectFacts]:
    """Every module's facts from the modules' summaries (files without a summary were not analysed
    yet: the prefilter ruled them out; they get facts when another module enters them).
    `unanalysable`: files the project asked for that gave no summary (a syntax error): nothing
    waits for them."""
    # Who has a method of a given name, in order of trust: methods of analysed modules; then methods
    # read from the text of modules the prefilter skipped; then abstract stand-ins (`def set_input(self):
    # pass` in a base class), which a subclass replaces.
    layout.methods = {}
    read: dict[str, list[tuple[str, str]]] = {}
    stand_ins: dict[str, list[tuple[str, str]]] = {}
    for path in layout.paths:
        if path in summaries:
            for qualname, function in summaries[path].functions.items():
                cls, _, method = qualname.rpartition(".")
                if cls:
                    (stand_ins if function.abstract else layout.methods).setdefault(method, []).append((path, qualname))
        else:
            for qualname in layout.methods_in_text(path):
                read.setdefault(qualname.rpartition(".")[2], []).append((path, qualname))
    for fallback in (read, stand_ins):
        for method, owners in fallback.items():
            layout.methods.setdefault(method, owners)
    fields: dict[str, set[str]] = {}
    for path in sorted(summaries):
        for name, cls in summaries[path].field_classes.items():
            # A library's class (`torch.nn.Conv2d`) counts too: the name is then not the project's alone.
            fields.setdefault(name, set()).add(_absolute_class(layout, path, cls) or cls)
    layout.fields = {name: cls for name, (cls, *more) in fields.items() if not more and cls.startswith("@")}
    resolved = {path: list(_resolved_edges(layout, path, summaries)) for path in sorted(summaries)}
    split = (
        _split_cuda_evidence(layout, resolved, summaries)
        | _inherited_cuda(layout, summaries)
        | _cuda_by_option(layout, summaries)
        | _cuda_by_settings(layout, summaries)
    )
    cuda = _cuda_closure(resolved, summaries, split)

    # Calls into functions that train, hold a step loop or do a step's work; functions entered per step.
    trains: dict[str, set[str]] = {}
    iterates: dict[str, set[tuple[str, str, int, bool, bool]]] = {}
    returned: dict[str, set[tuple[str, int, bool, bool]]] = {}
    values: dict[str, set[tuple[str, str, object]]] = {}
    loops: dict[str, set[str]] = {}
    work: dict[str, set[str]] = {}
    entered: dict[str, dict[str, str]] = {}
    passed: dict[str, set[tuple[str, str]]] = {}
    selecting: dict[str, set[tuple[str, str, str, object]]] = {}  # option_values, by module
    grad_off: dict[str, dict[str, bool]] = {}  # grad_off_callers, by module
    collectives: dict[str, set[tuple[str, str]]] = {}
    for path, edges in resolved.items():
        for edge, file, qualname in edges:
            if file != path:
                known = grad_off.setdefault(file, {})
                known[qualname] = known.get(qualname, True) and edge.grad_off
            target = summaries[file].functions.get(qualname) if file in summaries else None
            if target is not None:
                # Callbacks: a function handed to `qualname` for a parameter it calls.
                called = dict(target.called_params)
                for key, callback, does_work, holds_loop in edge.callables:
                    param = _parameter_named(target.params, key)
                    if does_work and not holds_loop:
                        passed.setdefault(file, set()).add((qualname, param))
                    if param in called and called[param].count(" → ") <= MAX_HOPS:
                        entered.setdefault(path, {}).setdefault(callback, called[param])
                        # called with autograd off there (`with torch.no_grad(): evaluate(model, batch)`)
                        known = grad_off.setdefault(path, {})
                        known[callback] = known.get(callback, True) and param in target.grad_off_params
                # What the call passes for the parameters that select arms of the target's code.
                for param in target.options:
                    position = str(target.params.index(param)) if param in target.params else None
                    passed_value = next(
                        ((tag, value) for key, tag, value in edge.literals if key in (param, position)), None
                    )
                    if passed_value is None:
                        passed_value = ("default", None)  # left out (or out of sight in `**kwargs`)
                    selecting.setdefault(file, set()).add((qualname, param, *passed_value))
                if target.collective:
                    collectives.setdefault(path, set()).add((edge.target, target.collective))
                for table, found in ((trains, target.trains), (loops, target.has_step_loop), (work, target.step_work)):
                    if found:
                        table.setdefault(path, set()).add(edge.target)
                for param, trained, again in target.iterates:
                    index = target.params.index(param) if param in target.params else -1
                    iterates.setdefault(path, set()).add((edge.target, param, index, trained, again))
                for key, value in edge.values:
                    name = _parameter_named(target.params, key)
                    if name in target.settings_params:
                        values.setdefault(file, set()).add((qualname, name, value))
            for element, trained, again in edge.result_uses:
                returned.setdefault(file, set()).add((qualname, element, trained, again))
            if edge.per_step is not None and edge.per_step.count(" → ") <= MAX_HOPS:
                entered.setdefault(file, {}).setdefault(qualname, edge.per_step)

    # The models of a repository that trains on CUDA: each one's forward may run per step, by a caller
    # the scan cannot follow. The prefilter skips a model file with no step code of its own, so
    # they are asked for first, and entered once all are analysed (the outermost only: which
    # models build which is known then).
    feeding = {
        layout.repository_of(path) for path, summary in summaries.items() if cuda.get(path) and summary.feeds_models
    }
    skipped = set(layout.paths) - summaries.keys() - set(unanalysable)
    models_asked = {
        path for path in skipped if layout.repository_of(path) in feeding and layout.text_facts(path).defines_model
    }
    unseen = set() if models_asked else _enter_unseen_models(layout, summaries, resolved, feeding, entered)
    if unseen:
        cuda = _cuda_closure(resolved, summaries, unseen | split)  # and on into what those models call

    # Values (argument and return kinds, classes) only matter where a finding can be: in a module
    # that targets CUDA and runs code per step. Elsewhere they would only stir more rounds.
    # A module the prefilter ruled out counts as active once CUDA reaches it: it is analysed then, and
    # its summary says whether it has step code.
    # A module that builds the DataLoaders step loops elsewhere iterate is active too: the loader rules
    # report there.
    active = {
        path
        for path in layout.paths
        if cuda.get(path)
        and (
            path in entered
            or path in iterates
            or path in returned
            or path not in summaries
            or summaries[path].has_step_code
        )
    }
    # The base classes' modules of code with steps, active or not yet: CUDA may come from a base (below).
    stepping = {path for path in summaries if summaries[path].has_step_code}
    reached = (
        {file for path in active for _, file, _ in resolved.get(path, ())}
        | models_asked
        | _base_modules(layout, summaries, stepping)
    )
    kinds: dict[str, dict[tuple[str, str], set[str]]] = {}
    classes: dict[str, dict[tuple[str, str], str]] = {}
    returns: dict[str, dict[str, tuple[str, ...]]] = {}
    returned_classes: dict[str, dict[str, str]] = {}
    for path, edges in resolved.items():
        for edge, file, qualname in edges:
            summary = summaries.get(file)
            if path in active and summary is not None and qualname in summary.returns:
                returns.setdefault(path, {})[edge.target] = summary.returns[qualname]
            if path in active and summary is not None and qualname in summary.returned_classes:
                where = _absolute_class(layout, file, summary.returned_classes[qualname])
                if where is not None:
                    returned_classes.setdefault(path, {})[edge.target] = where
            elif path in active and (made := _constructed_class(layout, path, edge, summaries)) is not None:
                returned_classes.setdefault(path, {})[edge.target] = made
            if file not in active:
                continue
            target = summary.functions.get(qualname) if summary is not None else None
            params = target.params if target is not None else ()
            for key, kind in edge.arguments:
                kinds.setdefault(file, {}).setdefault((qualname, _parameter_named(params, key)), set()).add(kind)
            for key, kind in edge.keyword_kinds:
                if target is not None and _into_star_kwargs(target.signature, key):
                    # `meters.update(loss=loss)` into `def update(self, **kwargs)`
                    kinds.setdefault(file, {}).setdefault((qualname, STAR_KWARGS), set()).add(kind)
            for key, cls in edge.classes:
                name = _parameter_named(params, key)
                where = _absolute_class(layout, path, cls)
                if where is not None:
                    classes.setdefault(file, {}).setdefault((qualname, name), where)

    # Modules whose functions train, or hold a step loop that feeds models (not an algorithm's counted
    # loop: every module of kornia imports one through its core utilities).
    training = {
        path
        for path, summary in summaries.items()
        if any(f.trains or (f.has_step_loop and summary.feeds_models) for f in summary.functions.values())
    }
    # The command-line defaults of the whole project, where every declaration of an option agrees.
    declared: dict[str, set[tuple[type[object], object]]] = {}
    for summary in summaries.values():
        for dest, value in summary.command_line_defaults:
            declared.setdefault(dest, set()).add((type(value), value))
    options = tuple(sorted((dest, value) for dest, ((_, value), *more) in declared.items() if not more))
    # DDP and `set_epoch` count where the code is connected: a repository's other scripts (an
    # `examples/` folder beside the training code) wrap their own models.
    component = _components(layout.paths, resolved)
    ddp = {component[path] for path, summary in summaries.items() if summary.wraps_ddp}
    set_epoch = {component[path] for path, summary in summaries.items() if summary.sets_sampler_epoch}
    facts = {}
    for path in layout.paths:
        facts[path] = ProjectFacts(
            roots=layout.roots,
            trains=frozenset(trains.get(path, ())),
            has_step_loop=frozenset(loops.get(path, ())),
            step_work=frozenset(work.get(path, ())),
            iterates=tuple(sorted(iterates.get(path, ()))),
            returned_uses=tuple(sorted(returned.get(path, ()))),
            argument_values=tuple(sorted(values.get(path, ()), key=repr)),
            entered=tuple(sorted(entered.get(path, {}).items())),
            cuda=bool(cuda.get(path)),
            imports_training=path not in summaries and _imports_training(layout, path, training),
            argument_kinds=tuple(
                (qualname, param, kind)
                for (qualname, param), found in sorted(kinds.get(path, {}).items())
                for kind in sorted(found)
            ),
            argument_classes=tuple((q, p, c) for (q, p), c in sorted(classes.get(path, {}).items())),
            return_kinds=tuple(sorted(returns.get(path, {}).items())),
            return_classes=tuple(sorted(returned_classes.get(path, {}).items())),
            active=path in active,
            reached=path in reached,
            command_line_defaults=options if path in active else (),
            config_file_values=layout.config_values(path) if path in active else (),
            grad_off_callers=tuple(sorted(grad_off.get(path, {}).items())),
            passed_step_work=tuple(sorted(passed.get(path, ()))),
            option_values=tuple(sorted(selecting.get(path, ()), key=repr)),
            wraps_ddp=component[path] in ddp,
            sets_sampler_epoch=component[path] in set_epoch,
            collectives=tuple(sorted(collectives.get(path, ()))),
        )
    return facts


def _components(paths: Iterable[str], resolved: dict[str, list[tuple[CallEdge, str, str]]]) -> dict[str, str]:
    """path -> a representative of the modules connected to it by calls (either way, transitively)."""
    parent = {path: path for path in paths}

    def find(path: str) -> str:
        while parent[path] != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    for path, edges in resolved.items():
        for _, file, _ in edges:
            if path in parent and file in parent:
                parent[find(path)] = find(file)
    return {path: find(path) for path in paths}


# Why the forward of a model nobody in the scan is seen to call counts as per-step.
UNSEEN_CALLER = (
    "the forward of a model whose caller the scan cannot follow (a registry, `importlib`, a file not scanned)"
)


def _enter_unseen_models(
    layout: ProjectLayout,
    summaries: dict[str, ModuleSummary],
    resolved: _Resolved,
    feeding: set[str],
    entered: dict[str, dict[str, str]],
) -> set[str]:
    """In a project that trains on CUDA, the `forward` of an `nn.Module` that no module of the scan is
    seen to call is still run once per step, by whatever builds the model: a registry
    (`models.__dict__[args.arch]`, `build_model(cfg)`), `importlib.import_module(args.model)` or a
    file outside the scan. Only the outermost such models are entered; what they call follows.
    "Trains" asks for a step loop that feeds models (trains, or draws batches) or a step hook: a
    library's counted loops (kornia's batched RANSAC) run its own algorithms, not the models'. And
    the training must be in the model's own repository, where the scan holds several: `feeding`,
    the repositories with a module on CUDA that feeds models."""
    if not feeding:
        return set()
    found = set()
    # A class another model builds or calls is one of its blocks, reached through it. One that code
    # outside any model builds or calls (a script's `criterion = CRDLoss(opt)`) is an outermost
    # model: where that code's per-step call is followed, its forward is entered already.
    referred = {
        (file, qualname.split(".", 1)[0])
        for path, edges in resolved.items()
        for edge, file, qualname in edges
        if edge.caller_class and _is_torch_module(layout, path, edge.caller_class, summaries)
    }
    for path, summary in summaries.items():
        if layout.is_library(path) or layout.repository_of(path) not in feeding:
            continue
        for qualname in summary.functions:
            cls, _, method = qualname.rpartition(".")
            if method != "forward" or not cls or "." in cls or (path, cls) in referred or cls in summary.classes_made:
                continue
            if qualname in entered.get(path, {}) or not _is_torch_module(layout, path, cls, summaries):
                continue
            entered.setdefault(path, {})[qualname] = UNSEEN_CALLER
            found.add(path)
    return found


def _is_torch_module(
    layout: ProjectLayout, path: str, cls: str, summaries: dict[str, ModuleSummary], depth: int = 0
) -> bool:
    summary = summaries.get(path)
    if summary is None or depth > 4:
        return False
    for base in summary.class_bases.get(cls, ()):
        if base in ("torch.nn.Module", "torch.nn.modules.module.Module") or base.endswith("nn.Module"):
            return True
        if base in summary.class_bases and _is_torch_module(layout, path, base, summaries, depth + 1):
            return True
        if "." in base and (hit := layout.resolve(path, f"{base}.__init__")) is not None:
            if _is_torch_module(layout, hit[0], hit[1].rsplit(".", 1)[0], summaries, depth + 1):
                return True
    return False


def _into_star_kwargs(signature: Signature, key: str) -> bool:
    """Does the keyword argument `key` land in the function's `**kwargs`?"""
    return (
        not key.isdigit()
        and signature.star_kwargs
        and key not in signature.params
        and key not in signature.keyword_only
    )


def _parameter_named(params: tuple[str, ...], key: str) -> str:
    """The parameter an argument fills: its keyword, or the name at its position ("0" -> "model")."""
    return params[int(key)] if key.isdigit() and int(key) < len(params) else key


def _resolved_edges(
    layout: ProjectLayout, path: str, summaries: dict[str, ModuleSummary]
) -> Iterator[tuple[CallEdge, str, str]]:
    """(edge, file, qualname) for each call of `path` that enters another scanned module."""
    for edge in summaries[path].edges:
        if edge.target.startswith("*."):
            yield from _by_method_name(layout, path, edge, summaries)
            continue
        if edge.target.endswith("[]"):
            yield from _registry_members(layout, path, edge, summaries)
            continue
        if edge.target.startswith("^"):
            yield from _overrides_elsewhere(layout, path, edge, summaries)
            continue
        made = edge.target.endswith("()")
        hit = layout.resolve(path, edge.target[:-2] if made else edge.target)
        if hit is None or hit[0] == path:
            continue
        file, qualname = hit
        if made:
            if file in summaries and qualname in summaries[file].class_bases:
                # `net = vgg16(classes)` ... `net(x)`: a class named like a function; calling the
                # instance runs its forward (faster-rcnn.pytorch's `class vgg16(_fasterRCNN)`)
                qualname = f"{qualname}.forward"
            else:
                qualname = summaries[file].factories.get(qualname, "") if file in summaries else ""
            if not qualname:
                continue
        if file in summaries:
            if qualname not in summaries[file].functions and f"{qualname}.__init__" in summaries[file].functions:
                qualname = f"{qualname}.__init__"  # `YOLOX(backbone, head)` runs YOLOX.__init__ with them
            file, qualname = _through_bases(layout, file, qualname, summaries)
            if file == path:
                continue
        yield edge, file, qualname


def _overrides_elsewhere(
    layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]
) -> Iterator[tuple[CallEdge, str, str]]:
    """`self.train_iter(data)` in class C of `path`: the `train_iter` of each subclass of C (at any
    depth) that another module defines and overrides it in."""
    cls, _, method = edge.target[1:].rpartition(".")
    subclasses = _subclasses(layout, summaries)
    todo, seen = [f"@{path}:{cls}"], set()
    while todo:
        for sub in subclasses.get(todo.pop(), ()):
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            file, _, name = sub[1:].rpartition(":")
            if file != path and f"{name}.{method}" in summaries[file].functions:
                yield edge, file, f"{name}.{method}"


def _subclasses(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> dict[str, list[str]]:
    """ "@file:Base" -> ["@file:Sub", ...], for the classes of the analysed modules (once per derivation)."""
    cached = layout.subclasses
    if cached is not None and cached[0] is summaries:
        return cached[1]
    found: dict[str, list[str]] = {}
    for file, summary in summaries.items():
        for name, bases in summary.class_bases.items():
            for base in bases:
                where = f"@{file}:{base}" if base in summary.class_bases else _absolute_class(layout, file, base)
                if where is not None:
                    found.setdefault(where, []).append(f"@{file}:{name}")
    layout.subclasses = (summaries, found)
    return found


def _registry_members(
    layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]
) -> Iterator[tuple[CallEdge, str, str]]:
    """`trainer_dict[cfg.TRAINER](...)` with `trainer_dict` imported from another module: a call of
    each member of that module's dict literal, resolved from there."""
    hit = layout.resolve(path, edge.target[:-2])
    if hit is None:
        return
    file, name = hit
    if file not in summaries:
        # Not analysed (a package's __init__.py with no step code): reached, so the next round reads it.
        yield replace(edge, per_step=None, result_uses=()), file, name
        return
    for member in summaries[file].registries.get(name, ()):
        target = layout.resolve(file, member) if not member.startswith("<local>.") else (file, member[8:])
        if target is None:
            continue
        owner, qualname = target
        if owner in summaries:
            if qualname not in summaries[owner].functions and f"{qualname}.__init__" in summaries[owner].functions:
                qualname = f"{qualname}.__init__"
            owner, qualname = _through_bases(layout, owner, qualname, summaries)
        if owner != path:
            yield edge, owner, qualname


# A method name that more of the project's classes than this define (with a signature the call fits)
# says nothing about which one a call means.
MAX_NAMESAKES = 6


def _by_method_name(
    layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]
) -> Iterator[tuple[CallEdge, str, str]]:
    """A call of a method on an object whose class cannot be known (built by `hydra.utils.instantiate`,
    a registry, `getattr(module, name)(...)`): every method of the project's classes with that name
    whose parameters the call's arguments fit, as call graphs resolve such calls (PyCG's fallback).
    The reach chain says it was resolved by name. A library scanned with the project is left out of a
    project's calls; methods read from the text of a module the prefilter skipped (no signature
    known) count only when they are the one method of that name."""
    method = edge.target[2:]
    owners = layout.methods.get(method, ())
    library = layout.is_library(path)
    fitting = []
    for file, qualname in owners:
        if file == path or (layout.is_library(file) and not library):
            continue
        facts = summaries[file].functions.get(qualname) if file in summaries else None
        if facts is None:
            if len(owners) == 1:
                fitting.append((file, qualname))
            elif edge.per_step is not None:
                # Known from its text only: not entered yet, but reached, so that it is analysed and
                # the next round can tell whether the per-step call fits it.
                yield replace(edge, per_step=None, result_uses=(), by_name=True), file, qualname
        elif not facts.abstract and facts.signature.accepts(edge.positional, edge.keywords):
            fitting.append((file, qualname))
    if not fitting and not owners and method in layout.fields:
        # `nets.discriminator(x)`: calling what the project stores under that name, its forward
        hit = layout.resolve(path, edge.target)
        fitting = [hit] if hit is not None else []
    if len(fitting) > MAX_NAMESAKES:
        return
    for file, qualname in fitting:
        named = edge
        if len(fitting) > 1:  # (one method of that name in the whole project is as good as typed)
            named = replace(edge, by_name=True)
            if edge.per_step is not None:
                named = replace(named, per_step=f"{edge.per_step}, resolved by name to `{qualname}`")
        yield named, file, qualname


def _split_cuda_evidence(layout: ProjectLayout, resolved: _Resolved, summaries: dict[str, ModuleSummary]) -> set[str]:
    """Modules whose CUDA evidence is split between them: one module names CUDA (Rainbow's main.py
    sets `args.device = torch.device("cuda")`) and calls into modules that move things to a device
    (agent.py's `.to(device=args.device)`), directly or through other modules. The namer and the
    movers it reaches count as targeting CUDA; unrelated scripts beside them do not, nor do other
    repositories of the scan, nor methods reached by their name alone."""
    found = set()
    for path, summary in summaries.items():
        if not summary.names_cuda or summary.moves_to_device:
            continue  # (a module with both halves decided for itself)
        repository = layout.repository_of(path)
        seen, todo = {path}, [path]
        while todo:
            for edge, file, _ in resolved.get(todo.pop(), ()):
                if file not in seen and not edge.by_name and layout.repository_of(file) == repository:
                    seen.add(file)
                    todo.append(file)
        movers = {file for file in seen if file in summaries and summaries[file].moves_to_device}
        if movers:
            found |= movers | {path}
    return found


def _cuda_by_option(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """The modules that move tensors to a device and declare, or import the module that declares, a
    command-line device option defaulting to CUDA (`parser.add_argument("--device", default="cuda")`
    in args.py, read as `torch.device(args.device)` in main.py, PyTorch-ENet): they run on CUDA
    unless told otherwise. Only those: in a repository of many scripts, one script's option says
    nothing about the others."""
    declaring = {
        path
        for path, summary in summaries.items()
        if any(
            "device" in dest.lower() and isinstance(value, str) and value.startswith("cuda")
            for dest, value in summary.command_line_defaults
        )
    }
    if not declaring:
        return set()
    return {
        path
        for path, summary in summaries.items()
        if summary.moves_to_device and (path in declaring or _imports_one_of(layout, path, declaring))
    }


def _cuda_by_settings(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """The modules that move tensors to a device and import a module that names a CUDA device but
    neither moves anything nor runs steps: a settings module (Precipitation-Nowcasting's config.py sets
    `cfg.GLOBAL.DEVICE = torch.device("cuda" if ...)`, read as `.to(cfg.GLOBAL.DEVICE)` by the trainer
    and the models). Only a device named by a "cuda" string counts: a helper module that merely seeds
    `torch.cuda` names no device its importers move to."""

    def is_settings(path: str) -> bool:
        summary = summaries.get(path)
        if summary is None:  # a module the prefilter kept from being parsed: what its text says
            return layout.text_facts(path).names_cuda_device
        return summary.names_cuda_device and not summary.moves_to_device and not summary.has_step_code

    found = set()
    for path, summary in summaries.items():
        if not summary.moves_to_device or summary.cuda:
            continue
        for module in layout.imported_modules(path):
            hit = layout.resolve(path, module + ".*")
            if hit is not None and hit[0] != path and is_settings(hit[0]):
                found.add(path)
                break
    return found


def _cuda_closure(
    resolved: _Resolved, summaries: dict[str, ModuleSummary], sources: set[str] | frozenset[str] = frozenset()
) -> dict[str, bool]:
    """CUDA flows from a module that targets it into the modules it calls per step, hands a device
    to, calls to run their steps (`train_one_epoch(model, optimizer)`), or takes a DataLoader from
    that its step loops then iterate. It also flows up, to a module whose
    steps call into one that targets CUDA itself (train.py's loop calling a trainer whose model is moved
    with `.cuda()`), or that hands such a module the loader its step loop iterates: that loop, that
    loader, drive the GPU. Only up from a module's own evidence, not from what
    flowed down into it: a helper that one CUDA script calls says nothing about its other callers.
    `sources`: modules that count as targeting CUDA besides their own evidence."""
    cuda = {path: summary.cuda or path in sources for path, summary in summaries.items()}

    def drives(edge: CallEdge, file: str, qualname: str) -> bool:
        # a per-step call, or a call handing over what the callee's step loop iterates (a loader)
        if edge.by_name:
            return False
        target = summaries[file].functions.get(qualname) if file in summaries else None
        return edge.per_step is not None or (target is not None and bool(target.iterates))

    changed = True
    while changed:
        changed = False
        for path, edges in resolved.items():
            if not cuda.get(path) and any(
                cuda.get(file) and drives(edge, file, qualname) for edge, file, qualname in edges
            ):
                cuda[path] = True
                changed = True
    changed = True
    while changed:
        changed = False
        for path, edges in resolved.items():
            if not cuda.get(path):
                continue
            for edge, file, qualname in edges:
                if (
                    not edge.by_name
                    and not cuda.get(file)
                    and (
                        edge.per_step
                        or edge.passes_device
                        or edge.result_uses
                        or _runs_steps(summaries, file, qualname)
                    )
                ):
                    cuda[file] = True
                    changed = True
    return cuda


def _runs_steps(summaries: dict[str, ModuleSummary], file: str, qualname: str) -> bool:
    """Does the called function train or hold a step loop (`train_one_epoch(model, optimizer)`)? Its
    steps run on whatever the CUDA caller hands it: the model it moved, the tensors it made there."""
    target = summaries[file].functions.get(qualname) if file in summaries else None
    return target is not None and (target.trains or target.has_step_loop)


def _imports_training(layout: ProjectLayout, path: str, training: set[str]) -> bool:
    """A file the prefilter ruled out that imports a module whose functions train or hold a step loop:
    its loop may be a step loop through them (`for batch in stream: engine.train_step(batch)`), an epoch
    loop handing them the loaders it builds (`train(epoch, train_loader, model)`), or, loop or not, it
    hands them loaders once (StarGAN's main.py: `Solver(celeba_loader, ...)`)."""
    return _imports_one_of(layout, path, training) or any(
        file in training for module in layout.imported_modules(path) for file in layout.files_in_package(module)
    )  # (the second: `from models import create_model`, a package)


def _imports_one_of(layout: ProjectLayout, path: str, files: set[str]) -> bool:
    """Does the file import (by its text) a module that is one of `files`?"""
    return any(
        (hit := layout.resolve(path, module + ".*")) is not None and hit[0] in files
        for module in layout.imported_modules(path)
    )


def _module_bases(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> dict[str, set[str]]:
    """Module -> the other modules defining project classes its classes derive from directly (read
    from _subclasses: through analysed modules, so a base module not analysed yet ends a chain)."""
    found: dict[str, set[str]] = {}
    for base, subs in _subclasses(layout, summaries).items():
        base_file = base[1:].rpartition(":")[0]
        for sub in subs:
            sub_file = sub[1:].rpartition(":")[0]
            if sub_file != base_file:
                found.setdefault(sub_file, set()).add(base_file)
    return found


def _project_bases(module_bases: dict[str, set[str]], path: str) -> set[str]:
    """The modules of `path`'s classes' project base classes, at any depth."""
    found: set[str] = set()
    todo = [path]
    while todo:
        for file in module_bases.get(todo.pop(), ()):
            if file != path and file not in found:
                found.add(file)
                todo.append(file)
    return found


def _base_modules(layout: ProjectLayout, summaries: dict[str, ModuleSummary], paths: set[str]) -> set[str]:
    """Modules whose classes the classes of `paths` derive from: reached, so that a base class's module
    the prefilter skipped (st-gcn's `IO`, which sets `self.dev = "cuda:0"`) is analysed."""
    module_bases = _module_bases(layout, summaries)
    return {file for path in paths for file in _project_bases(module_bases, path)}


def _inherited_cuda(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """Modules whose classes derive from a class of a module that targets CUDA itself: what the base
    class sets up (`self.dev = "cuda:0"`, `self.model.to(self.dev)`) is the subclass's too, so its
    `data.to(self.dev)` in another module is a copy to the GPU."""
    module_bases = _module_bases(layout, summaries)
    return {
        path
        for path in module_bases
        if not summaries[path].cuda
        and any(summaries[base].cuda for base in _project_bases(module_bases, path) if base in summaries)
    }


def _constructed_class(
    layout: ProjectLayout, caller: str, edge: CallEdge, summaries: dict[str, ModuleSummary]
) -> str | None:
    """ "@file:Class" when the edge calls a class of another module by its imported name, whatever its
    case (faster-rcnn's `fasterRCNN = vgg16(imdb.classes)`, `class vgg16(_fasterRCNN)`): the call
    makes an instance of it."""
    if edge.target[:1] in "^*&@<" or edge.target.endswith(("()", "[]")):
        return None
    hit = layout.resolve(caller, edge.target)
    if hit is None or hit[0] == caller or hit[0] not in summaries:
        return None
    file, qualname = hit
    return f"@{file}:{qualname}" if qualname in summaries[file].class_bases else None


def _absolute_class(layout: ProjectLayout, caller: str, cls: str) -> str | None:
    """ "@file:Class" for a class named in `caller` ("models.Net" imported, "<local>.Net" its own)."""
    if cls.startswith("@"):
        return cls
    if cls.startswith("<local>."):
        return f"@{caller}:{cls[8:]}"
    hit = layout.resolve(caller, cls + ".__init__")
    if hit is None:
        return None
    file, qualname = hit
    return f"@{file}:{qualname.rsplit('.', 1)[0]}"


def _through_bases(
    layout: ProjectLayout, file: str, qualname: str, summaries: dict[str, ModuleSummary], depth: int = 0
) -> tuple[str, str]:
    """`Net.forward` where Net inherits `forward` from a base class: the file and qualname that define
    it, in the same module or in the module a base class is imported from (faster-rcnn's
    `FasterRCNNVGG16.predict`, defined by `model.faster_rcnn.FasterRCNN`)."""
    summary = summaries.get(file)
    if summary is None or qualname in summary.functions or depth > 5:
        return file, qualname
    cls, _, method = qualname.rpartition(".")
    if method == "forward" and f"{cls}.__call__" in summary.functions:
        return file, f"{cls}.__call__"
    for base in summary.class_bases.get(cls, ()):
        if base in summary.class_bases:
            found = _through_bases(layout, file, f"{base}.{method}", summaries, depth + 1)
        elif "." in base and (hit := layout.resolve(file, f"{base}.{method}")) is not None and hit[0] != file:
            found = _through_bases(layout, *hit, summaries, depth + 1)
        else:
            continue
        defined = summaries[found[0]].functions if found[0] in summaries else layout.methods_in_text(found[0])
        if found[1] in defined:
            return found  # (a module the prefilter skipped is read from its text; entering it gets it analysed)
    return file, qualname
