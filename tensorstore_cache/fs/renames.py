"""The atomic renames Linux offers beyond ``rename(2)``: swap two entries, or never replace one.

Both are ``renameat2``, reached through ctypes; where the system or the file
system lacks it the callers fall back (:func:`exchange_dirs` says so, and
:func:`rename_noreplace` checks for the target first, which leaves a window
only there).
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Any

__all__ = ["exchange_dirs", "rename_noreplace"]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)
_renameat2: Any = None
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux, or a C library without renameat2
    _renameat2 = None


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns
    -------
    bool
        ``True`` if swapped; ``False`` where the system or file system cannot
        (the caller then falls back to two renames). Other errors are raised.
    """
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(b))


def rename_noreplace(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, dir_fd: int | None = None
) -> None:
    """Rename ``src`` to ``dst`` (both in ``dir_fd``, or paths) unless ``dst`` exists.

    Raises
    ------
    FileExistsError
        If ``dst`` exists (nothing is renamed).
    """
    fd = _AT_FDCWD if dir_fd is None else dir_fd
    if _renameat2 is not None:
        if _renameat2(fd, os.fsencode(src), fd, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in _UNSUPPORTED:
            raise OSError(err, os.strerror(err), os.fspath(dst))
    try:  # no renameat2 here: the check leaves a window, where these systems leave one
        os.stat(dst, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
