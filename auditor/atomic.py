"""Writing a file so that no reader, and no crash, ever sees half of it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_atomically(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`. The file keeps
    its permissions when it exists, and gets the usual ones (0666 minus the umask) when it does not:
    a temporary file starts as 0600. A symbolic link stays a link: its target is written (beside
    the target, so the rename stays within one file system)."""
    path = os.path.realpath(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    handle, temporary = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(os.path.abspath(path))
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    current = os.umask(0)  # the only way to read it is to set it
    os.umask(current)
    return current
