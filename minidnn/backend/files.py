"""Files written atomically: a temporary file beside the target, filled, flushed and fsync'ed, renamed over the
target with ``os.replace`` and the directory fsync'ed.  A writer killed at any point leaves the old file or the new,
never half of one, and no temporary file behind.  The new file gets the permissions ``open(path, "wb")`` would give
(an existing target's own mode, else 0o666 minus the umask).  Used by checkpoints (minidnn.save) and the autotune
cache."""
from __future__ import annotations

import os
import tempfile

__all__ = ["write_atomically"]


def write_atomically(path, write) -> None:
    """Call ``write(f)`` with ``f`` a binary file open on a temporary file beside ``path``, then make it ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        _chmod_like_open(fd, path)
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory):
    if os.name != "posix":
        return     # Windows cannot open a directory for fsync; os.replace is already atomic there
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask can only set-and-return)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _chmod_like_open(fd, path):
    """Give the temporary file the permissions ``open(path, "wb")`` would: an existing target's own mode,
    else 0o666 minus the umask.  mkstemp creates it 0o600 (owner only), which the rename would keep."""
    if not hasattr(os, "fchmod"):
        return                                   # Windows: no POSIX modes
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.fchmod(fd, mode)
