"""Bytes on disk of a benchmark's store (standard library only: it runs in every environment)."""

from __future__ import annotations

import contextlib
import os


def dir_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the regular files under ``path``.

    Parameters
    ----------
    path
        A directory (or one that does not exist: 0).

    Returns
    -------
    int
        The bytes of every file below it, symbolic links not followed.
    """
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
