"""Temporary sibling directories, removing trees, and measuring them.

Work that must appear atomically (a build, a download) happens in a hidden
sibling ``.<name><mark><host>-<pid>-<random>`` of its target and is published
by one rename. A process killed before that leaves the directory behind; it
is removed by the next process that looks, at once when its owner is a dead
process of this host, otherwise (another host sharing the directory) once it
is old.

Removing a directory always renames it aside first (:func:`remove_tree`), so
a reader or writer that addresses it by name sees it vanish in one step.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

__all__ = ["age_text", "collect_temp_siblings", "disk_usage", "remove_tree", "temp_sibling"]


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def temp_sibling(target: Path, mark: str) -> Path:
    """Return a fresh hidden sibling path of ``target`` owned by this process."""
    return target.parent / f".{target.name}{mark}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def collect_temp_siblings(directory: Path, prefix: str, max_age_s: float) -> None:
    """Remove the entries of ``directory`` named ``prefix<host>-<pid>-*`` of dead owners.

    Parameters
    ----------
    directory
        Where the temporary siblings live.
    prefix
        ``.<name><mark>`` of the target whose leftovers to collect.
    max_age_s
        Entries older than this are removed whoever owned them.
    """
    host = _host()
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        owner = entry.name[len(prefix) :].split("-")
        dead = False
        if len(owner) == 3 and owner[0] == host and owner[1].isdigit():
            try:
                os.kill(int(owner[1]), 0)
            except ProcessLookupError:
                dead = True
            except PermissionError:
                pass
        try:
            old = time.time() - entry.stat().st_mtime > max_age_s
        except OSError:
            continue
        if dead or old:
            shutil.rmtree(entry, ignore_errors=True)


def remove_tree(path: Path, aside: Path | None = None) -> None:
    """Delete a directory: first renamed aside (one atomic step), then removed.

    Once renamed, a task still running somewhere (an executor cannot always
    stop a started task) that addresses files by the old name can no longer
    create anything the removal would miss. An interrupted removal leaves the
    aside name behind, for the next collection of temporary siblings.

    Parameters
    ----------
    path
        The directory (or file) to delete; nothing happens if it is gone.
    aside
        Where to rename it first (default ``<path>.discard``, which still
        matches the temporary-sibling pattern of ``path``).
    """
    doomed = aside if aside is not None else path.with_name(path.name + ".discard")
    try:
        path.rename(doomed)
    except OSError:
        doomed = path
    if doomed.is_dir() and not doomed.is_symlink():
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            doomed.unlink()


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
