"""What the modules of one scan tell each other.

Each analysed module yields a small, picklable `ModuleSummary` (what its functions do, which calls it
makes into other modules and why each runs once per step); from all the summaries the project derives
each module's `ProjectFacts` (derivation.py), which its next analysis reads (stepmodel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from loopaudit.analysis.module_index import Signature


@dataclass(frozen=True)
class ProjectFacts:
    """What the rest of the project says about one module. Equal facts give equal findings, so the
    scan re-analyses a module only when its facts change (and a cache can key on them)."""

    # First parts of the project's module names: calls to anything else (torch, numpy) never enter it.
    roots: frozenset[str] = frozenset()
    trains: frozenset[str] = frozenset()  # call targets (as this module's imports name them) that train
    has_step_loop: frozenset[str] = frozenset()  # ... that run a step loop of their own
    step_work: frozenset[str] = frozenset()  # ... that train, run a forward pass or fetch a batch
    entered: tuple[tuple[str, str], ...] = ()  # (qualname, origin): own functions entered per step elsewhere
    cuda: bool = False  # a module that targets CUDA drives this one's code
    # (qualname, parameter, kind): what the callers in other modules pass (a Kind's value, merged here)
    argument_kinds: tuple[tuple[str, str, str], ...] = ()
    # (qualname, parameter, value): the setting (an int or bool, such as a worker count) that the callers
    # in other modules pass for a parameter that is a setting of a function of this module (a DataLoader
    # argument, a loop's cadence: summarize._settings_params)
    argument_values: tuple[tuple[str, str, object], ...] = ()
    # (qualname, parameter, "@file:Class"): the class of the object the callers pass
    argument_classes: tuple[tuple[str, str, str], ...] = ()
    # (call target as this module names it, (whole, element 0, ...) Kind values): what calls return
    return_kinds: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # (call target as this module names it, "@file:Class"): the class of the object a call returns
    # (YOLOX's `model = self.exp.get_model()`)
    return_classes: tuple[tuple[str, str], ...] = ()
    # (call target, parameter, its position or -1, whether the loop trains): functions of other modules
    # whose step loop iterates what the call passes for that parameter (a DataLoader built here)
    iterates: tuple[
        tuple[str, str, int, bool, bool], ...
    ] = ()  # (..., whether the loop trains, whether again and again)
    # (qualname, element or -1 for the whole value, trains, again and again): what a function of this
    # module returns is iterated by a step loop elsewhere (a DataLoader a helper builds and returns)
    returned_uses: tuple[tuple[str, int, bool, bool], ...] = ()
    # (destination, value): the declared defaults of the command-line options of the other modules
    # (int or bool, the same wherever declared): `args.num_workers` in a data factory handed `args`
    command_line_defaults: tuple[tuple[str, object], ...] = ()
    # (key, value): the integer and boolean settings the repository's YAML configuration files agree
    # on (config_files.py): `config["num_workers"]` in a script that loads one
    config_file_values: tuple[tuple[str, object], ...] = ()
    # The prefilter ruled the module out, but it loops and imports a module whose functions train or
    # hold a step loop: its loops may feed them, so it is parsed after all.
    imports_training: bool = False
    # It targets CUDA (itself or through a caller) and runs code per step (its own loop or hook, or
    # entered from elsewhere): the only kind of module whose findings values and CUDA can change.
    active: bool = False
    # An active module calls into it (not necessarily per step): what it returns or builds, a model
    # made by a factory method (YOLOX's `exp.get_model()`), is needed there, so it is analysed even
    # when the prefilter sees no step code in it. Or it defines a model in a repository that trains
    # on CUDA, whose caller may be one the scan cannot follow (derive_facts).
    reached: bool = False
    # (qualname, parameter): a function of this module whose callers elsewhere pass, for a parameter it
    # calls, a function that does a step's work (a callback that runs the model: `sample2dir(...,
    # sample_fn)`); a loop calling it on every iteration is then a step loop
    passed_step_work: tuple[tuple[str, str], ...] = ()
    # (qualname, parameter, tag, value): what the callers in other modules pass for a parameter that
    # selects an arm of a function of this module (options.py): tag "=" a literal value, "default"
    # left out, "unread" something that cannot be read statically
    option_values: tuple[tuple[str, str, str, object], ...] = ()
    # (qualname, whether every call from other modules runs with autograd off): a function of this module
    # that other modules call, and whether they all call it under `torch.no_grad()` (drqv2's `act`)
    grad_off_callers: tuple[tuple[str, bool], ...] = ()
    # Some module of the project wraps a model in DDP (itself or through Accelerate/Fabric), and some
    # module calls `.set_epoch(...)` (distributed.py): what the distributed-training rules ask.
    wraps_ddp: bool = False
    sets_sampler_epoch: bool = False
    # (call target, collective): calls into communication helpers of other modules (`utils.reduce_dict`)
    collectives: tuple[tuple[str, str], ...] = ()

    def demand_analysis(self) -> bool:
        """Does the project need the module analysed whatever it looks like? Its step loop, its torch
        import or its device may be in the caller, and the project may wait for its summary."""
        return bool(self.entered) or self.cuda or self.imports_training or self.reached

    def analysis_key(self) -> tuple[object, ...]:
        """What the module's analysis depends on: facts equal in this key give the same findings and
        summary, so the module need not be analysed again. Outside an active module only the facts
        about steps matter (CUDA and values change no finding there, and no summary)."""
        steps = (
            self.trains,
            self.has_step_loop,
            self.step_work,
            self.entered,
            self.iterates,
            self.returned_uses,
            self.argument_values,
            self.imports_training,
            self.active,
            self.reached,
            self.passed_step_work,
            self.option_values,
            self.grad_off_callers,
            self.wraps_ddp,
            self.sets_sampler_epoch,
            self.collectives,
        )
        if not self.active:
            return steps
        return (
            *steps,
            self.cuda,
            self.argument_kinds,
            self.argument_classes,
            self.return_kinds,
            self.return_classes,
            self.command_line_defaults,
            self.config_file_values,
        )

    def grown(self, newer: ProjectFacts) -> ProjectFacts:
        """These facts joined with a later round's. What is known about steps and CUDA only grows,
        so the rounds settle instead of swinging between two answers; what values are (argument and
        return kinds, classes) is refined from round to round, so the later word stands."""
        if newer == self:
            return self  # the common case in later rounds (the tuples are sorted sets, so joining changes nothing)
        return replace(
            newer,
            trains=self.trains | newer.trains,
            has_step_loop=self.has_step_loop | newer.has_step_loop,
            step_work=self.step_work | newer.step_work,
            iterates=tuple(sorted(set(self.iterates) | set(newer.iterates))),
            returned_uses=tuple(sorted(set(self.returned_uses) | set(newer.returned_uses))),
            entered=tuple(sorted({**dict(newer.entered), **dict(self.entered)}.items())),
            cuda=self.cuda or newer.cuda,
            imports_training=self.imports_training or newer.imports_training,
            active=self.active or newer.active,
            reached=self.reached or newer.reached,
            passed_step_work=tuple(sorted(set(self.passed_step_work) | set(newer.passed_step_work))),
            option_values=tuple(sorted(set(self.option_values) | set(newer.option_values), key=repr)),
            wraps_ddp=self.wraps_ddp or newer.wraps_ddp,
            sets_sampler_epoch=self.sets_sampler_epoch or newer.sets_sampler_epoch,
            collectives=tuple(sorted(set(self.collectives) | set(newer.collectives))),
        )

    def reaches_project(self, target: str) -> bool:
        # ".x" relative, "@file:Class.m" a class a caller handed in, "*.m" a method of an untyped object,
        # "&mods:name" a star import, "^Class.m" the overrides of a method called on self
        return target.startswith((".", "@", "*", "&", "^")) or target.split(".", 1)[0] in self.roots


@dataclass(frozen=True)
class CallEdge:
    target: str  # qualified through the caller's imports: "engine.train_one_epoch", ".utils.f", "models.Net.forward"
    per_step: str | None  # why the call runs once per step, with marks for its lines (origins.py); None if not
    passes_device: bool  # an argument names the device (`device`, `args.device`, `x.cuda()`, `gpu`)
    # (position or keyword, Kind value) of each argument, and (position or keyword, class) where the
    # argument is an object whose class is known ("models.Net" as the caller imports it, "<local>.Net")
    arguments: tuple[tuple[str, str], ...] = ()
    classes: tuple[tuple[str, str], ...] = ()
    # (element or -1, trains, again and again) for each step loop that iterates what the call returns
    result_uses: tuple[tuple[int, bool, bool], ...] = ()
    # (position or keyword, value) of each argument that is a setting read statically (constants.py)
    values: tuple[tuple[str, object], ...] = ()
    caller_class: str = ""  # the top-level class whose method makes the call ("" outside any class)
    # How many positional arguments it passes (-1: a `*args` or `**kwargs` makes it unknown) and the
    # keywords: which methods of that name it could call, when the receiver's class is unknown.
    positional: int = -1
    keywords: tuple[str, ...] = ()
    # Resolved by the method's name alone (derive_facts sets it on the edges it fans out): a guess good
    # enough to follow the step, not to carry CUDA from one module to another.
    by_name: bool = False
    # (position or keyword, qualname, does a step's work, holds a step loop) of each argument that names
    # a function of the caller's module (a callback: `sample2dir(..., sample_fn)`)
    callables: tuple[tuple[str, str, bool, bool], ...] = ()
    # (position or keyword, tag, value) of each argument: tag "=" with a literal's value, else "unread"
    literals: tuple[tuple[str, str, object], ...] = ()
    grad_off: bool = (
        False  # the call runs with autograd off (`with torch.no_grad():` around it, here or up its callers)
    )
    # (keyword, Kind value) of each keyword argument as the code shows it, names not taken at their
    # word: what lands in a `**kwargs` (`meters.update(loss=loss)`)
    keyword_kinds: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FunctionFacts:
    trains: bool
    has_step_loop: bool
    step_work: bool
    params: tuple[str, ...] = ()  # positional parameters, `self` left out: position -> name
    # parameters a step loop of its own iterates, whether it trains, and whether it iterates them again
    # and again (once per epoch: a loader the constructor keeps for `train()` to iterate every epoch)
    iterates: tuple[tuple[str, bool, bool], ...] = ()
    settings_params: tuple[
        str, ...
    ] = ()  # parameters that are settings: a DataLoader's arguments, a loop's cadence (summarize.py)
    abstract: bool = False  # a method a subclass must provide: `pass`, `...` or `raise NotImplementedError` only
    signature: Signature = Signature()  # noqa: RUF009 (frozen: one shared default is safe); what calls it accepts (a call resolved by method name must fit)
    # (parameter, why the call runs per step) for each parameter it calls per step: a callback
    # (`def run(step_fn): for b in loader: step_fn(b)`), entered per step in the module that passes it
    called_params: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()  # parameters whose value selects an arm of its code (options.py)
    # the called parameters it calls only with autograd off (`with torch.no_grad(): evaluate(model, batch)`)
    grad_off_params: tuple[str, ...] = ()
    collective: str = ""  # the collective it runs for its caller, a communication helper (distributed.py)


@dataclass(frozen=True)
class ModuleSummary:
    functions: dict[str, FunctionFacts] = field(default_factory=dict)  # qualname -> what calling it does
    class_bases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # class -> bases (qualified if imported)
    edges: tuple[CallEdge, ...] = ()
    cuda: bool = False  # the module's own evidence that it targets CUDA (device.py)
    # qualname -> (whole, element 0, ...) Kind values of what it returns, where something is known
    returns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    factories: dict[str, str] = field(default_factory=dict)  # qualname -> "qualname.inner", the function it returns
    has_step_code: bool = False  # a step loop or a step hook of its own
    # qualname -> the class of the object it returns (as class_of names it: imported, or "<local>.X")
    returned_classes: dict[str, str] = field(default_factory=dict)
    # attribute or keyword name -> the class of the object stored under it (`self.generator = Generator()`,
    # `Munch(generator=Generator(...))`), where the module says so
    field_classes: dict[str, str] = field(default_factory=dict)
    # its own classes it builds (a block of a bigger model defined beside it)
    classes_made: frozenset[str] = frozenset()
    # a step loop that trains, fetches batches (`get_batch`), or runs models on what a loader yields;
    # or a step hook: a job that feeds models data, not only a loop of a library's own algorithms
    # (a batched RANSAC, `for data in data_iter: check(data)`)
    feeds_models: bool = False
    # (destination, value) of its command-line options whose declared default is an int or a bool
    command_line_defaults: tuple[tuple[str, object], ...] = ()
    # It names CUDA without moving anything to a device, or the reverse: with a module of the same
    # repository doing the other half, the project runs on CUDA (device.names_cuda).
    names_cuda: bool = False
    names_cuda_device: bool = False  # a "cuda" string: a device, not just a `torch.cuda` call (seeding)
    moves_to_device: bool = False
    # module-level name -> what its dict literal maps keys to, as this module names them
    # (`trainer_dict = {"base": BaseTrainer, "crd": CRDTrainer}`): a call `trainer_dict[key](...)`
    # may construct or call any of them
    registries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    wraps_ddp: bool = False  # distributed.wraps_ddp
    sets_sampler_epoch: bool = False  # distributed.sets_sampler_epoch
