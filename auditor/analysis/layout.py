"""The project's files: which folders are repositories, which packages are libraries, and which file
each imported module name stands for.

Imports resolve the way Python would from the project's folders: `from engine import f` and
`import utils` to a module of that name nearest the importing file, `from ..losses import f` against
the importing file's package. Files the prefilter kept from being parsed are read as text (`TextFacts`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from loopaudit.analysis.config_files import read_config_values
from loopaudit.analysis.lines import source_lines
from loopaudit.digests import content_digest

if TYPE_CHECKING:
    from loopaudit.analysis.cross_module import ModuleSummary

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import\b|import[ \t]+([\w.]+))", re.M)


# A top-level class and the methods of its body (`def m(self`), read from the text of a file that was
# not parsed: enough to tell which class a `sampler.update(...)` call enters.
# The names a module defines at its top level (functions, classes, assigned names), read from its text;
# what a package's __init__.py imports from its submodules is found in those submodules instead.
_CUDA_DEVICE_TEXT = re.compile(r"""["']cuda(:\d+)?["']""")
_MOVE_TEXT = re.compile(r"\.(cuda|to)\(")
_TOP_LEVEL = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)|^(\w+)[ \t]*(?::[^=\n]*)?=[^=]", re.M)
_CLASS = re.compile(r"class[ \t]+(\w+)")
_METHOD = re.compile(r"([ \t]+)(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\([ \t]*self\b")
# A top-level class with a `Module` among its bases: a model, which the project asks to have analysed
# where its repository trains on CUDA (derive_facts); the prefilter does not pass it for that.
_MODULE_CLASS = re.compile(r"^class[ \t]+\w+[ \t]*\([^)\n]*\bModule\b", re.M)


# Packages that are libraries wherever their sources sit: a call into them is never into the project.
LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "numpy",
        "scipy",
        "transformers",
        "diffusers",
        "timm",
        "accelerate",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "datasets",
        "peft",
        "trl",
        "deepspeed",
        "apex",
        "ignite",
        "torch_geometric",
        "dgl",
        "jax",
        "tensorflow",
        "sklearn",
        "pandas",
    }
)


# What marks the top of a repository. A scan of a folder holding several (a corpus of sdists, a
# workspace of clones) holds several projects, and one's training does not run another's models.
REPOSITORY_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def marked_folders(paths: Iterable[str]) -> list[str]:
    """The folders holding a repository marker, from the files' common folder down to each file's:
    what the scan's split into repositories is made from (sorted; the paths are absolute)."""
    folders = {os.path.dirname(path) for path in paths}
    if not folders:
        return []
    top = os.path.commonpath(folders)
    ancestors = set()
    for folder in folders:
        while folder not in ancestors and len(folder) >= len(top):
            ancestors.add(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return sorted(
        folder
        for folder in ancestors
        if any(os.path.exists(os.path.join(folder, marker)) for marker in REPOSITORY_MARKERS)
    )


class TextFacts(NamedTuple):
    """What the text of a file says, for files the prefilter kept from being parsed."""

    imports: list[str]  # the modules it imports
    methods: tuple[str, ...]  # "Class.method" of its top-level classes
    defined: frozenset[str]  # the names it defines at its top level
    defines_model: bool  # a top-level class with a `Module` among its bases
    # it names a CUDA device ("cuda", 'cuda:0') and moves nothing (no `.cuda(`, `.to(`): settings
    names_cuda_device: bool = False


class ProjectLayout:
    """Which file each module name of the scan stands for."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = sorted({os.path.abspath(p) for p in paths})
        self._by_name: dict[str, list[str]] = {}
        self._files = set(self.paths)
        self._texts: dict[str, TextFacts] = {}
        self._text_digests: dict[str, str] = {}
        self._resolved: dict[tuple[str, str], tuple[str, str] | None] = {}
        # method name -> [(file, "Class.method")], filled in from the summaries (derive_facts)
        self.methods: dict[str, list[tuple[str, str]]] = {}
        # field name -> "@file:Class" of the one class the project stores under that name (derive_facts)
        self.fields: dict[str, str] = {}
        # (the summaries it was read from, "@file:Base" -> ["@file:Sub"]) (_subclasses)
        self.subclasses: tuple[dict[str, ModuleSummary], dict[str, list[str]]] | None = None
        self._loose_folders: set[str] = set()
        self._libraries: dict[str, bool] = {}
        self._packages_on_disk: dict[str, bool] = {}
        self._repositories: tuple[str, ...] = ()
        self._configs: dict[str, tuple[tuple[str, object], ...]] = {}  # folder -> its YAML settings
        if not self.paths:
            self.root = self.scanned_root = ""
            return
        self.root = os.path.commonpath([os.path.dirname(p) for p in self.paths])
        self.scanned_root = self.root  # (self.root may climb to name packages; nothing is read above this)
        self._repositories = self._outermost_repositories(self.root)
        # The scanned folder may be a package itself (`scan pytorchyolo/`, whose modules import
        # `pytorchyolo.utils.loss`): names start up to a few package levels above it.
        scanned = self.root
        for _ in range(3):
            parent = os.path.dirname(self.root)
            if parent == self.root or not os.path.basename(self.root).isidentifier():
                break
            self.root = parent
        # The scanned folder, when it has no `__init__.py`, is a project folder rather than a
        # package: when it is named like one of its modules (raft/ holding core/raft.py, put on
        # sys.path by the script), `from raft import RAFT` means that module.
        if scanned != self.root and not os.path.isfile(os.path.join(scanned, "__init__.py")):
            parts = os.path.relpath(scanned, self.root).split(os.sep)
            self._loose_folders = {".".join(parts[i:]) for i in range(len(parts))}
        for path in self.paths:
            for name in self.module_names(path):
                self._by_name.setdefault(name, []).append(path)
        self._children: dict[str, list[str]] = {}  # package -> the module names directly in it
        self._packages: set[str] = set()  # every package a module name lies in (`yolox`, `yolox.models`)
        for name in self._by_name:
            package, _, _ = name.rpartition(".")
            if package:
                self._children.setdefault(package, []).append(name)
            parts = name.split(".")
            self._packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def _outermost_repositories(self, top: str) -> tuple[str, ...]:
        """The repositories the scan holds below its common folder, each with its folder's separator:
        the outermost marked folders (a repository's CUDA extension with a setup.py of its own, or a
        vendored clone, stays part of it). None, the empty tuple, when the common folder is marked
        itself: a scan of one repository is one project."""
        outermost: list[str] = []
        for folder in marked_folders(self.paths):
            if folder == top:
                return ()
            if not any(folder.startswith(known) for known in outermost):
                outermost.append(folder + os.sep)
        return tuple(outermost)

    def repository_of(self, path: str) -> str:
        """The folder of the repository the file lies in: one of the outermost marked folders below
        the scan's common folder, or "" for the rest of the scan."""
        for folder in self._repositories:
            if path.startswith(folder):
                return folder
        return ""

    def is_library(self, path: str) -> bool:
        """Is the file part of a library's own sources (`torch/_inductor/ir.py` in a scan of
        site-packages/torch)? It is analysed as a file of its own: a library's internals are not
        the steps of a project, and following them would only cost time. The name that says so is
        the scan's longest one, or the one Python imports the file by from its outermost package:
        a clone of the library's repository (`diffusers/src/diffusers/models/unet.py`, where `src/`
        is no package) is its sources too."""
        known = self._libraries.get(path)
        if known is None:
            names = self.module_names(path)
            known = bool(names) and (
                names[0].split(".", 1)[0] in self.libraries
                or self._package_name(path).split(".", 1)[0] in self.libraries
            )
            self._libraries[path] = known
        return known

    def _package_name(self, path: str) -> str:
        """`a.b.c` for `.../a/b/c.py` where a/ and b/ hold an `__init__.py` and a/'s folder does not."""
        stem = os.path.basename(path)[:-3]
        parts = [] if stem == "__init__" else [stem]
        folder = os.path.dirname(path)
        while self._is_package(folder):
            parts.append(os.path.basename(folder))
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        return ".".join(reversed(parts))

    @functools.cached_property
    def libraries(self) -> frozenset[str]:
        """The LIBRARIES this scan's project does not shadow. A research repository's own `datasets/`
        folder (or `datasets.py`) beside its scripts is what `from datasets.loader import ...` imports
        there: Python puts the script's folder first on sys.path. A library's own sources keep their
        name: they sit in site-packages or a `src/` folder, beside their distribution's metadata, or
        at the top of a checkout with its packaging files or named after them (a clone of
        pytorch-image-models' `timm/`)."""
        named = set()  # (folder, name) of each file or folder named like a library
        for path in self.paths:
            folder, name = os.path.dirname(path), os.path.basename(path)[:-3]
            while True:  # the file itself, then each folder above it, up to the scanned folder's top
                if name in LIBRARIES:
                    named.add((folder, name))
                if not folder.startswith(self.scanned_root) or folder == self.scanned_root:
                    break
                folder, name = os.path.dirname(folder), os.path.basename(folder)
        # (each place read once: a library's own checkout holds thousands of files below its name)
        return LIBRARIES - {name for folder, name in named if self._top_level_of_project(folder, name)}

    def _top_level_of_project(self, folder: str, name: str) -> bool:
        """Is `folder/name` a top-level module or package of a project rather than a library's own?"""
        if self._is_package(folder) or os.path.basename(folder) in ("src", "site-packages", "dist-packages", name):
            return False  # (`timm/timm/`: a clone of the library, in a folder named after it)
        packaging = ("setup.py", "setup.cfg", "pyproject.toml", "PKG-INFO")
        try:
            beside = os.listdir(folder)
            inside = os.listdir(os.path.join(folder, name)) if os.path.isdir(os.path.join(folder, name)) else []
        except OSError:
            return False
        if any(
            entry in packaging or (entry.startswith(name) and entry.endswith((".dist-info", ".egg-info")))
            for entry in beside
        ):
            return False
        # A checkout of the library named after it (`diffusers/src/diffusers/`, `peft/peft/`), not a package
        return not any(entry in packaging or entry == name for entry in inside) and not (
            "src" in inside and os.path.isdir(os.path.join(folder, name, "src", name))
        )

    def _is_package(self, folder: str) -> bool:
        known = self._packages_on_disk.get(folder)
        if known is None:
            known = self._packages_on_disk[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return known

    def module_names(self, path: str) -> list[str]:
        """`root/a/b/c.py` may be imported as `c`, `b.c` or `a.b.c` (whichever folder is on sys.path)."""
        inside = self.root if self.root.endswith(os.sep) else self.root + os.sep
        # The paths are absolute and under the root (as the layout's own are): cut instead of relpath.
        relative = path[len(inside) :] if path.startswith(inside) else os.path.relpath(path, self.root)
        parts = relative.split(os.sep)
        parts[-1] = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
        if parts[-1] == "__init__":
            parts.pop()
        return [".".join(parts[i:]) for i in range(len(parts)) if all(p.isidentifier() for p in parts[i:])]

    @functools.cached_property
    def signature(self) -> str:
        """What the layout is made of: equal signatures resolve every name the same way."""
        return repr((self.root, sorted(self._loose_folders), self._repositories, self.paths))

    def config_values(self, path: str) -> tuple[tuple[str, object], ...]:
        """The settings the YAML configuration files of the file's repository agree on (config_files.py)."""
        folder = self.repository_of(path) or self.scanned_root
        if folder not in self._configs:
            self._configs[folder] = read_config_values(folder)
        return self._configs[folder]

    def configs_read(self) -> dict[str, tuple[tuple[str, object], ...]]:
        """What was read from YAML configuration files so far, by folder."""
        return dict(self._configs)

    def text_facts(self, path: str) -> TextFacts:
        return self._read(path)

    def texts_read(self) -> dict[str, tuple[str, TextFacts]]:
        """What was read so far from the text of files (resolving names, skipped files), with the
        digest of the bytes it was read from."""
        return {path: (self._text_digests[path], facts) for path, facts in self._texts.items()}

    def imported_modules(self, path: str) -> list[str]:
        """The modules a file imports, read from its text (for files that were not parsed)."""
        return self._read(path).imports

    def methods_in_text(self, path: str) -> tuple[str, ...]:
        """ "Class.method" for the methods of the file's top-level classes, read from its text."""
        return self._read(path).methods

    def _read(self, path: str) -> TextFacts:
        cached = self._texts.get(path)
        if cached is None:
            try:
                with open(path, "rb") as stream:
                    data = stream.read()
            except OSError:
                data = b""
            self._text_digests[path] = content_digest(data)
            # As a text-mode read: undecodable bytes replaced, universal newlines.
            text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
            cached = self._texts[path] = TextFacts(
                imports=[match.group(1) or match.group(2) for match in _IMPORT.finditer(text)],
                methods=_text_methods(text),
                defined=frozenset(match.group(1) or match.group(2) for match in _TOP_LEVEL.finditer(text)),
                defines_model=_MODULE_CLASS.search(text) is not None,
                names_cuda_device=_CUDA_DEVICE_TEXT.search(text) is not None and _MOVE_TEXT.search(text) is None,
            )
        return cached

    @functools.cached_property
    def roots(self) -> frozenset[str]:
        """First parts of the module names a call may enter. A library scanned together with its
        users (torch's own sources, whose tests call into torch) stays a library: its internals are
        not the project's steps."""
        return frozenset(name.split(".", 1)[0] for name in self._by_name) - self.libraries

    def resolve(self, importer: str, target: str) -> tuple[str, str] | None:
        """(file, qualname in it) for a call target, or None when it is not in the project."""
        if target.startswith("*."):
            return self._resolve(importer, target)  # by method name: `methods` changes every round
        key = (importer, target)
        if key not in self._resolved:
            # The files and their names are fixed for the scan: each round asks the same questions.
            self._resolved[key] = self._resolve(importer, target)
        return self._resolved[key]

    def _resolve(self, importer: str, target: str) -> tuple[str, str] | None:
        if target.split(".", 1)[0] in self.libraries:
            return None
        if target.startswith("@"):
            file, _, qualname = target[1:].rpartition(":")
            return (file, qualname) if file in self._files else None
        if target.startswith("*."):
            owners = self.methods.get(target[2:], ())
            if not owners and target[2:] in self.fields:
                # `nets.discriminator(x)`: calling what the project stores under that name, its forward
                file, _, cls = self.fields[target[2:]][1:].rpartition(":")
                return (file, f"{cls}.forward") if file in self._files else None
            return owners[0] if len(owners) == 1 else None
        if target.startswith("&"):
            return self._resolve_star(importer, target)
        if target.startswith("."):
            return self._resolve_relative(importer, target)
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module, qualname = ".".join(parts[:cut]), ".".join(parts[cut:])
            candidates = self._by_name.get(module)
            if module in self._packages and not (module in self._loose_folders and candidates):
                # `yolox` is the package, not yolox/models/yolox.py known by its short name
                candidates = [c for c in candidates or () if os.path.basename(c) == "__init__.py"]
            if candidates:
                # The module nearest the importing file: two projects in one scan both have utils.py.
                best = max(candidates, key=lambda c: (len(os.path.commonpath([c, importer])), c))
                if os.path.basename(best) != "__init__.py" or parts[cut] in self._read(best).defined:
                    return best, qualname
            found = self._reexported(module, qualname)
            if found is not None or (module in self._packages and module not in self._loose_folders):
                # A package of the scan (`yolox.utils`) that does not define the name: the call leaves
                # the scanned files. A shorter cut would only find a module named like the package
                # (yolox/models/yolox.py for `yolox`).
                return found
        return None

    def _resolve_star(self, importer: str, target: str) -> tuple[str, str] | None:
        """ "&utils,layers:name": `name` from whichever star-imported module of the scan defines it
        (the last import wins, as in Python)."""
        modules, _, name = target[1:].rpartition(":")
        for module in reversed(modules.split(",")):
            found = self.resolve(importer, f"{module}.{name}")
            if found is not None and name in self._read(found[0]).defined:
                return found
        return None

    def files_in_package(self, package: str) -> list[str]:
        """The files of the modules directly in a package of the scan (none for a plain module)."""
        return [path for child in self._children.get(package, ()) for path in self._by_name[child]]

    def _reexported(self, package: str, qualname: str) -> tuple[str, str] | None:
        """`from model import FasterRCNNVGG16`, where model/__init__.py re-exports it from a submodule
        (or was not scanned): the one module directly in the package that defines it."""
        head = qualname.split(".", 1)[0]
        found = [path for path in self.files_in_package(package) if head in self._read(path).defined]
        return (found[0], qualname) if len(set(found)) == 1 else None

    def _resolve_relative(self, importer: str, target: str) -> tuple[str, str] | None:
        level = len(target) - len(target.lstrip("."))
        base = os.path.dirname(importer)
        for _ in range(level - 1):
            base = os.path.dirname(base)
        parts = target[level:].split(".")
        for cut in range(len(parts) - 1, -1, -1):
            folder = os.path.join(base, *parts[:cut])
            for candidate in (folder + ".py", os.path.join(folder, "__init__.py")):
                if cut and candidate.endswith("/.py"):
                    continue
                if candidate in self._files and cut < len(parts):
                    return candidate, ".".join(parts[cut:])
        return None


def _text_methods(text: str) -> tuple[str, ...]:
    found = []
    owner, indent = None, None
    for line in source_lines(text):  # not splitlines: a form feed does not end a line
        if line[:1] not in ("", " ", "\t", "#", ")", "]", "}", '"', "'"):
            match = _CLASS.match(line)
            owner, indent = (match.group(1) if match else None), None  # a new top-level statement
            continue
        method = _METHOD.match(line) if owner is not None else None
        if method is not None:
            indent = indent or method.group(1)  # the class body's level; nested defs are deeper
            if method.group(1) == indent:
                found.append(f"{owner}.{method.group(2)}")
    return tuple(found)
