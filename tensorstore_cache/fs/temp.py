"""Temporary names: one scheme for everything prepared beside its target, and its sweepers.

Whatever must appear in one step (a build, a download, a file written then
renamed into place, a directory created with its modes already set) is
prepared under a hidden sibling name that :func:`temp_path` makes::

    .<target>.tsc-<kind>-<host>-<pid>-<token>

``kind`` says what it is (:data:`TempKind`): ``build`` a store being built,
``fetch`` a download, ``new`` a file or directory being prepared (renamed or
linked into place once complete), ``gc`` something being deleted (renamed
aside first, :func:`delete_tree`). ``host`` and ``pid`` name its owner. A
temporary name of a temporary entry is made from the first target, so
whoever sweeps a target's leftovers finds all of them.

A process killed before it publishes leaves the entry behind. Every sweeper
reads names with :func:`parse_temp` and asks :meth:`TempName.stale`: an
entry whose owner is a live process of this host is never removed; one whose
owner is a dead process of this host is removed at once; one of another host
(whose owner cannot be asked) once it is older than the sweeper's limit.

Removing a directory always renames it aside first (:func:`delete_tree`), so
a reader or writer that addresses it by name sees it vanish in one step.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

__all__ = [
    "TempKind",
    "TempName",
    "collect_temps",
    "delete_tree",
    "discard_tree",
    "parse_temp",
    "remove_temps",
    "remove_tree",
    "temp_path",
]

TempKind = Literal["build", "fetch", "gc", "new"]
"""What a temporary entry is: a build, a download, something prepared, something being deleted."""

_NAME = re.compile(
    r"\.(?P<target>.+)\.tsc-(?P<kind>build|fetch|gc|new)-"
    r"(?:(?P<host>[^-]*)-(?P<pid>[0-9]+)-)?(?P<token>[0-9a-f]+)"
    # earlier versions: an aside of a temporary entry (".old", ".discard"); "gc" without owner
    r"(?:\.old|\.discard)?"
)


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has ended and is not yet reaped (state Z or X in
    ``/proc/<pid>/stat``; False where there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")"
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] in (b"Z", b"X")


def _host() -> str:
    return socket.gethostname().replace("-", "_")


@dataclass(frozen=True, slots=True)
class TempName:
    """What the name of a temporary entry says (see :func:`parse_temp`)."""

    target: str
    """The name of the entry it is prepared for (or was renamed aside from)."""
    kind: TempKind
    """What it is."""
    host: str | None
    """Host name of its owner (``-`` written as ``_``); None if no owner is recorded."""
    pid: int | None
    """Process id of its owner on ``host``; None if no owner is recorded."""

    def _owner(self) -> bool | None:
        """True: a live process of this host (a recycled pid counts as alive: its entry
        waits); False: a process of this host that no longer exists, or that has ended and
        waits only for its parent to reap it (a zombie: a killed builder whose parent has not
        yet called wait); None: nobody can tell."""
        if self.pid is None or self.host != _host():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _ended(self.pid)

    def owner_alive(self) -> bool:
        """Whether its owner is a live process of this host."""
        return self._owner() is True

    def owner_dead(self) -> bool:
        """Whether its owner is a process of this host that no longer exists."""
        return self._owner() is False

    def stale(self, age_s: float, max_age_s: float) -> bool:
        """Whether a sweeper removes it, ``age_s`` seconds after it last changed.

        Never while its owner is a live process of this host; at once when the
        owner is dead; otherwise (another host's, or no owner recorded) once
        older than ``max_age_s``.
        """
        owner = self._owner()
        if owner is not None:
            return not owner
        return age_s > max_age_s


def parse_temp(name: str) -> TempName | None:
    """Read a directory entry's name: a :class:`TempName`, or None if it is not temporary.

    Examples
    --------
    >>> parse_temp(".s.tsc.tsc-build-gpu_3-4242-0a1b2c3d")
    TempName(target='s.tsc', kind='build', host='gpu_3', pid=4242)
    >>> parse_temp("s.tsc") is None
    True
    """
    found = _NAME.fullmatch(name)
    if found is None:
        return None
    pid = found["pid"]
    return TempName(
        found["target"], cast(TempKind, found["kind"]), found["host"],
        None if pid is None else int(pid),
    )


def temp_path(target: str | os.PathLike[str], kind: TempKind) -> Path:
    """Return a fresh temporary name for ``target``, beside it, owned by this process.

    The one way every temporary name of the package is made. ``target`` may
    be relative (to a directory descriptor). A temporary entry's own
    temporary names are made from its target's name.
    """
    head, name = os.path.split(os.fspath(target))
    parsed = parse_temp(name)
    base = parsed.target if parsed is not None else name
    return Path(head, f".{base}.tsc-{kind}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def collect_temps(
    directory: Path,
    max_age_s: float,
    *,
    target: str | None = None,
    kind: TempKind | None = None,
    any_owner: bool = False,
) -> list[Path]:
    """Remove the stale temporary entries of ``directory`` (see :meth:`TempName.stale`).

    Only entries of the current user are removed (unless ``any_owner``): a
    shared cache's other users' leftovers are theirs (or
    ``gc(all_users=True)``'s) to remove.

    Parameters
    ----------
    directory
        Where the temporary entries live.
    max_age_s
        Entries of other hosts older than this are removed.
    target
        Only those prepared for (or renamed aside from) this name.
    kind
        Only those of this kind (default: every kind).
    any_owner
        Also other users' entries.

    Returns
    -------
    list of Path
        What was removed.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    now = time.time()
    removed = []
    for name in names:
        temp = parse_temp(name)
        if temp is None or (target is not None and temp.target != target):
            continue
        if kind is not None and temp.kind != kind:
            continue
        entry = directory / name
        try:
            st = entry.lstat()
        except OSError:
            continue
        if st.st_uid != os.geteuid() and not any_owner:
            continue
        if temp.stale(now - st.st_mtime, max_age_s) and remove_tree(entry):
            removed.append(entry)
    return removed


def remove_temps(root: Path) -> int:
    """Delete every temporary file under ``root``, whoever made it; return the count.

    For a tree whose writers have all finished (a build's directory, once
    its tasks are done): what attempts killed mid-write left.
    """
    count = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if parse_temp(name) is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    count += 1
    return count


#: Passes of a removal: an entry created inside the tree while it is removed (by a
#: process still holding a descriptor of the directory) is removed by the next pass.
_REMOVE_PASSES = 5
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def delete_tree(path: Path, aside: Path | None = None) -> OSError | None:
    """Delete a directory: first renamed aside (one atomic step), then removed.

    Once renamed, a task still running somewhere (an executor cannot always
    stop a started task) that addresses files by the old name can no longer
    create anything the removal would miss; an entry created meanwhile through
    a descriptor of the directory is removed by a further pass. An interrupted
    removal leaves the aside name behind, for the next sweeper.

    Parameters
    ----------
    path
        The directory (or file) to delete; nothing happens if it is gone.
    aside
        Where to rename it first (default: a ``gc`` temporary name of
        ``path``, :func:`temp_path`).

    Returns
    -------
    OSError or None
        None if nothing is left of it; else the error that kept something (a
        path the system does not let this process rename, another user's in a
        sticky directory, is not touched at all: ``EPERM``/``EACCES``; files it
        may not delete stay under the aside name).
    """
    doomed = aside if aside is not None else temp_path(path, "gc")
    try:
        path.rename(doomed)
    except FileNotFoundError:
        doomed = path
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOTSUP, errno.EINVAL):
            return exc  # not ours to remove (EPERM, EACCES), or busy: keep it whole
        doomed = path
    errors: list[OSError] = []

    def record(_func: object, _path: str, info: Any) -> None:
        exc = info[1] if isinstance(info, tuple) else info  # onerror: exc_info; onexc: exc
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            errors.append(exc)

    for _attempt in range(_REMOVE_PASSES):
        errors.clear()
        if doomed.is_dir() and not doomed.is_symlink():
            if sys.version_info >= (3, 12):
                shutil.rmtree(doomed, onexc=record)
            else:
                shutil.rmtree(doomed, onerror=record)
        else:
            try:
                doomed.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors.append(exc)
        if not os.path.lexists(doomed):
            return None
        if any(e.errno in _DENIED for e in errors):
            break  # another pass would be refused the same way
    denied = [e for e in errors if e.errno in _DENIED]
    if denied:
        return denied[0]
    return errors[0] if errors else OSError(errno.ENOTEMPTY, "still not empty", str(doomed))


def discard_tree(path: str | os.PathLike[str], *, strict: bool = False) -> None:
    """Delete a directory tree in place, without renaming it aside first: what this process
    made and no other process reads (a scratch directory, a build's staging, a status
    directory), or what a rename already took out of sight.

    Parameters
    ----------
    path
        The directory.
    strict
        Raise the first error (a missing directory included); by default errors are ignored
        and what could not be deleted stays.
    """
    if strict:
        shutil.rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_tree(path: Path, aside: Path | None = None) -> bool:
    """Delete a directory as :func:`delete_tree` does; return whether nothing is left of it."""
    return delete_tree(path, aside) is None
