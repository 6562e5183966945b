"""What housekeeping reports: the bytes a tree takes on disk, and how old something is."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["age_text", "disk_usage"]


def disk_usage(path: Path) -> int:
    """Bytes taken by ``path``: a file's size, or the sum over a tree (symlinks not followed)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def age_text(seconds: float) -> str:
    """Say how long ``seconds`` is: ``"9.0 days"``, ``"3.5 hours"``, ``"12.0 minutes"``, ``"40 s"``."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
