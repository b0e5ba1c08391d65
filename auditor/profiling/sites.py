"""Which line of the user's script is running: the innermost frame outside torch, other installed
packages, the standard library and loopaudit itself.

The profiler cannot answer this (its Python frames carry a function's first line, not the calling
line), so the probe walks the interpreter's own stack at the moment an operation happens.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

_LIBRARY_ROOTS = tuple(
    os.path.normcase(os.path.realpath(path)) + os.sep
    for path in {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_OWN_ROOT = os.path.normcase(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep
_cache: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    known = _cache.get(filename)
    if known is None:
        if filename.startswith("<"):
            known = False  # <frozen runpy>, <string>, <stdin>
        else:
            path = os.path.normcase(os.path.realpath(filename))
            known = not path.startswith(_OWN_ROOT) and not path.startswith(_LIBRARY_ROOTS)
        _cache[filename] = known
    return known


def user_site(skip: int = 1) -> tuple[str, int] | None:
    """(file, line) of the innermost user frame above the caller, or None."""
    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if is_user_file(filename):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None
