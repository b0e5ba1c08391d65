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
# loopaudit's own folder (this file is loopaudit/profiling/in_script/sites.py)
_OWN_ROOT = os.path.normcase(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))) + os.sep
_user: dict[str, bool] = {}
_own: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    known = _user.get(filename)
    if known is None:
        if filename.startswith("<"):
            known = False  # <frozen runpy>, <string>, <stdin>
        else:
            path = os.path.normcase(os.path.realpath(filename))
            known = not path.startswith(_OWN_ROOT) and not path.startswith(_LIBRARY_ROOTS)
        _user[filename] = known
    return known


def is_own_file(filename: str) -> bool:
    """A file of loopaudit itself: its wrappers sit between the user's call and torch."""
    known = _own.get(filename)
    if known is None:
        known = _own[filename] = os.path.normcase(os.path.realpath(filename)).startswith(_OWN_ROOT)
    return known


def caller_frame() -> FrameType | None:
    """The frame that called into loopaudit's wrappers: the first one outside loopaudit."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and is_own_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_frame(frame: FrameType | None) -> FrameType | None:
    """`frame` itself if it is the user's, else the nearest user frame above it."""
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_site() -> tuple[str, int] | None:
    """(file, line) of the innermost user frame above loopaudit's own, or None."""
    frame = user_frame(caller_frame())
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
