"""A persistent cache of each file's analysis, as ruff keeps one: an unchanged file is not parsed again.

An entry is one file's outcome (findings, internal problems, project summary) under a key made of
everything the analysis reads:

- the file's bytes (a content hash, so a touched but unchanged file still hits);
- the scan options (rules, step methods, periodic names, device);
- in a project-wide scan, the facts the other modules gave it (project.py). Those are derived from the
  summaries of the modules it depends on, so they stand for those modules' contents, but more
  precisely: an edit elsewhere that changes nothing about this module leaves its entries valid;
- the file's path and display name (findings carry them);
- loopaudit itself: its version and a digest of its own sources, so an edited checkout never reads
  results of the code it replaced.

The scan asks the same questions in the same order with or without the cache (the rounds of a project
scan depend only on the outcomes), so the findings are identical either way.

Entries are written atomically (a temporary file renamed into place), so concurrent runs and a killed
run leave only whole entries. An entry that cannot be read back, for whatever reason, is a miss.

The folder lies in the scanned project, where a pull request can commit files of its own. So an entry
is plain JSON, read back only into the type the engine asks for (plain_data.py), and it is signed with
a key that this user's loopaudit keeps outside any project (`~/.cache/loopaudit/cache-key`): an entry
that this machine's loopaudit did not write, or that was edited since, is a miss, never a result.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import cast

from loopaudit import __version__
from loopaudit.atomic import write_atomically
from loopaudit.digests import canonical, content_digest
from loopaudit.scan.plain_data import InvalidData, from_plain, to_plain

FOLDER_NAME = ".loopaudit_cache"
_VERSION_FOLDER = re.compile(r"^[0-9][0-9A-Za-z.+_-]*-[0-9a-f]{16}$")  # "0.1.0-774bf7feac968e7f"
ENVIRONMENT_VARIABLE = "LOOPAUDIT_CACHE_DIR"
_CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by loopaudit.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)


class ResultCache:
    """The cache as one scan sees it: each file is hashed once, when the scan first asks for it."""

    def __init__(self, folder: str | Path) -> None:
        self.root = Path(folder)
        self.folder = self.root / f"{__version__}-{_own_sources_digest()}"
        self._options_digests: dict[int, str] = {}
        self._memo: dict[int, tuple[object, str]] = {}
        self._contents: dict[str, str | None] = {}  # path -> digest of its bytes, hashed once per scan
        self.hits = 0
        self.misses = 0
        self._writable = True
        self._signing_key: bytes | None = None  # read when first needed; b"": none can be had
        self._key_problem = ""  # why none can be had

    def prepare(self) -> str | None:
        """Create the folder (with a .gitignore that ignores it whole, and a CACHEDIR.TAG that tells
        backup tools to skip it). None when it is ready, else why the scan runs without it."""
        if not self._key():
            return f"cannot keep the cache's signing key in {_key_file()}: {self._key_problem}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for name, text in ((".gitignore", "# Created by loopaudit.\n*\n"), ("CACHEDIR.TAG", _CACHEDIR_TAG)):
                marker = self.root / name
                if not marker.exists():
                    write_atomically(marker, text.encode())
        except OSError as error:
            self._writable = False
            return f"cannot use the cache folder {self.root}: {error.strerror or error}"
        self._remove_other_versions()
        return None

    def _remove_other_versions(self) -> None:
        """Entries of another loopaudit (an upgrade, an edited checkout) are never read again: drop
        them, so the folder does not grow with every version. A run of that other version at the
        same moment loses its cache, not its results (an entry that cannot be written is skipped)."""
        try:
            others = [entry for entry in os.scandir(self.root) if entry.is_dir() and _VERSION_FOLDER.match(entry.name)]
        except OSError:
            return
        for entry in others:
            if entry.name != self.folder.name:
                shutil.rmtree(entry.path, ignore_errors=True)

    def key(self, path: str, display_name: str, explicit: bool, options, facts, *, fresh: bool = False) -> str | None:
        """The entry's name, or None when the file cannot be read (its analysis says why). The file
        is hashed once per scan, unless `fresh`."""
        content = self.content_digest(path, fresh=fresh)
        if content is None:
            return None
        parts = (
            content,
            os.path.abspath(path),
            display_name,
            "explicit" if explicit else "found",
            self._options_digest(options),
            self._facts_text(facts),
        )
        return hashlib.blake2b("\0".join(parts).encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()

    def _facts_text(self, facts) -> str:
        """canonical(facts), written once per facts object: every module of a project starts from the
        same one (engine.py)."""
        if facts is None:
            return "None"
        known = self._memo.get(id(facts))
        if known is None or known[0] is not facts:
            known = self._memo[id(facts)] = (facts, canonical(facts, self._memo))
        return known[1]

    def content_digest(self, path: str, *, fresh: bool = False) -> str | None:
        """The digest of the file's bytes as this scan first read them (`fresh`: as they are now)."""
        if fresh:
            return _content_digest(path)
        if path not in self._contents:
            self._contents[path] = _content_digest(path)
        return self._contents[path]

    def scan_key(self, items, layout_marks: list[str]) -> str | None:
        """The entry of a whole scan's result: every file's key, in the scan's order, and what else
        on disk splits the files into projects (`layout_marks`: project.marked_folders). The project's
        facts are derived from these alone, so equal inputs give an equal result."""
        keys = [
            self.key(path, display_name, explicit, options, None) for path, display_name, explicit, options in items
        ]
        if None in keys:
            return None
        text = "\n".join([*cast("list[str]", keys), *layout_marks])
        return "scan-" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()

    def facts_key(self, layout_signature: str, digests: dict[str, str | None]) -> str:
        """The entry of the project facts derived from these summaries (None: a file not analysed)."""
        text = "\n".join([layout_signature, *(f"{path}\0{digests[path]}" for path in sorted(digests))])
        return "facts-" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()

    def lines_key(self, path: str) -> str | None:
        """The entry of a file's line numbers by place in its walk (origins.py), by its contents."""
        content = _content_digest(path)
        return None if content is None else f"lines-{content}"

    def still_current(self, path: str, display_name: str, explicit: bool, options, facts, *, key: str | None) -> bool:
        """Is the file still what was hashed when `key` was made? A file edited while the scan read
        it must not store its new findings under its old contents."""
        return self.key(path, display_name, explicit, options, facts, fresh=True) == key

    def get(self, key: str | None, kind):
        """The value of type `kind` stored under `key`, or None: absent, truncated, corrupt, written by
        another machine or user, or not of that type are all misses, never a crash."""
        if key is None or not self._key():
            return None
        try:
            with open(self._entry(key), "rb") as stream:
                signature, _, body = stream.read().partition(b"\n")
            if not hmac.compare_digest(signature, self._sign(body)):
                raise InvalidData("not signed by this user's loopaudit")
            stored_key, plain = json.loads(body)
            if stored_key != key:
                raise InvalidData("stored under another key")
            value = from_plain(kind, plain)
        except (OSError, ValueError, TypeError, RecursionError):  # InvalidData and JSON errors are ValueErrors
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str | None, value, kind) -> None:
        if key is None or not self._writable or not self._key():
            return
        entry = self._entry(key)
        try:
            body = json.dumps([key, to_plain(value, kind)], ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            data = body.encode("utf-8", "surrogatepass")
        except ValueError:  # a value JSON cannot hold (a NaN): not stored, analysed again next time
            return
        try:
            entry.parent.mkdir(exist_ok=True)
            write_atomically(entry, self._sign(data) + b"\n" + data)
        except OSError:
            self._writable = False  # a full or read-only disk: the scan goes on without storing

    def _key(self) -> bytes:
        """The signing key (b"" where none can be had: then nothing is read or written)."""
        if self._signing_key is None:
            try:
                self._signing_key = _signing_key()
            except OSError as error:
                self._signing_key, self._key_problem = b"", error.strerror or str(error)
        return self._signing_key

    def _sign(self, body: bytes) -> bytes:
        return hashlib.blake2b(body, key=self._key(), digest_size=32).hexdigest().encode()

    def _entry(self, key: str) -> Path:
        return self.folder / key[:2] / key[2:]

    def _options_digest(self, options) -> str:
        digest = self._options_digests.get(id(options))
        if digest is None:
            parts = (
                sorted(rule.code for rule in options.rules),
                sorted(options.extra_hooks),
                sorted(options.periodic_names),
                options.device,
            )
            digest = self._options_digests[id(options)] = repr(parts)
        return digest


def default_folder(project_root: Path) -> Path:
    """`LOOPAUDIT_CACHE_DIR` if set, else `.loopaudit_cache` at the project's root."""
    configured = os.environ.get(ENVIRONMENT_VARIABLE)
    return Path(configured) if configured else project_root / FOLDER_NAME


def _key_file() -> Path:
    """Where this user's signing key lives: their own cache folder, never a scanned project."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "loopaudit" / "cache-key"


_SIGNING_KEY: bytes | None = None


def _signing_key() -> bytes:
    """The key, made on first use: 32 random bytes readable by this user alone. Concurrent first
    runs agree on one: each links its own file into place, and the first link wins."""
    global _SIGNING_KEY
    if _SIGNING_KEY is None:
        path = _key_file()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fresh = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(descriptor, os.urandom(32))
            finally:
                os.close(descriptor)
            try:
                os.link(fresh, path)
            except FileExistsError:
                pass
            finally:
                os.unlink(fresh)
        key = path.read_bytes()
        if len(key) != 32:
            raise OSError("the file there is not a loopaudit key (delete it to make a new one)")
        _SIGNING_KEY = key
    return _SIGNING_KEY


def _content_digest(path: str) -> str | None:
    """None for what cannot be read, or must not be: a FIFO named *.py would block the scan."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as stream:
            return content_digest(stream.read())
    except OSError:
        return None


_SOURCES_DIGEST: str | None = None


def _own_sources_digest() -> str:
    """A digest of loopaudit's own .py files (the engine and the rules, which may be installed in
    different folders): an edited checkout is a different analyser."""
    global _SOURCES_DIGEST
    if _SOURCES_DIGEST is None:
        digest = hashlib.blake2b(digest_size=8)
        for package in ("loopaudit", "loopaudit.rules"):
            folder = Path(cast(str, importlib.import_module(package).__file__)).parent
            for source in sorted(folder.rglob("*.py")):
                digest.update(f"{package}/{source.relative_to(folder).as_posix()}".encode())
                digest.update(source.read_bytes())
        _SOURCES_DIGEST = digest.hexdigest()
    return _SOURCES_DIGEST
