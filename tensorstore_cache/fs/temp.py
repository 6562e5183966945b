"""Temporary sibling directories: naming them, and collecting those of dead processes.

Work that must appear atomically (a build, a download) happens in a hidden
sibling ``.<name><mark><host>-<pid>-<random>`` of its target and is published
by one rename. A process killed before that leaves the directory behind; it
is removed by the next process that looks, at once when its owner is a dead
process of this host, otherwise (another host sharing the directory) once it
is old.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from pathlib import Path

__all__ = ["collect_temp_siblings", "discard", "temp_sibling"]


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


def discard(tmp: Path) -> None:
    """Remove an abandoned temporary directory.

    It is renamed first: a task still running somewhere (an executor cannot
    always stop a started task) addresses files by the old name, so it can no
    longer create anything the removal would miss.
    """
    doomed = tmp.with_name(tmp.name + ".discard")
    try:
        tmp.rename(doomed)
    except OSError:
        doomed = tmp
    shutil.rmtree(doomed, ignore_errors=True)
