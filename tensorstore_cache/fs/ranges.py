"""Readers' holds on the shards of one store version: byte-range locks on one file.

A store whose shards are fetched on demand keeps ``<version>.holds`` beside
its version directory in the node cache. It is locked with Linux *open file
description* locks (``F_OFD_SETLK``), one byte per purpose, so a process
needs one descriptor per open version however many shards it maps (3,664
shards at 10M items would be past the usual 1,024 descriptors with one
locked file per shard)::

    byte k          shared while a process maps shard k (its hold)
    FETCH + k       exclusive while a process downloads shard k
    VERSION         shared while a process has the version open

An evictor deletes shard ``k`` only after taking an exclusive lock on byte
``k`` without waiting (:func:`try_lock_range`), so never while a process
maps it; a whole version only after locking every byte. The kernel drops a
dead process's locks, ``SIGKILL`` included. OFD locks belong to the open
file description, so unlike POSIX ``fcntl`` locks they conflict between two
descriptors of one process (two stores, or a store and the evictor). A
forked child shares its parent's description: every live
:class:`RangeHolds` gets a description of its own in the child
(``os.register_at_fork``) before anything can unlock the parent's bytes.

Locks off or unsupported are handled as every lock of the package is
(:func:`~tensorstore_cache.fs.locks.attempt`): holds are then empty and
evictors fall back to a grace period.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import struct
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from .locks import attempt, locks_enabled
from .opens import create_file
from .trust import Trust

__all__ = ["FETCH", "RangeHolds", "VERSION", "try_lock_range", "unlock_range"]

#: First byte of the download locks (``FETCH + k`` for shard ``k``).
FETCH = 1 << 40
#: The byte every process that has the version open holds shared.
VERSION = 1 << 41
_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)


def _lock(fd: int, kind: int, start: int, length: int = 1, *, wait: bool) -> None:
    """Apply one OFD lock operation (``length`` 0: to the end of the file, however long)."""
    arg = struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)
    fcntl.fcntl(fd, _SETLKW if wait else _SETLK, arg)


_live: weakref.WeakSet[RangeHolds] = weakref.WeakSet()


class RangeHolds:
    """This process's holds on one store version (one descriptor, any number of shards).

    Parameters
    ----------
    path
        The version's ``.holds`` file (created if missing).
    trust
        The cache directory's rules (default: private): a new file gets the
        mode every user of the cache may write; an existing one is checked.
    """

    def __init__(self, path: Path, trust: Trust | None = None) -> None:
        self.path = path
        self._trust = trust if trust is not None else Trust.private()
        self._counts: dict[int, int] = {}
        self._lock = threading.Lock()
        # the descriptor lives in a list the finalizer shares (it must not refer to self)
        self._box: list[int | None] = [self._open_locked()]
        self._finalizer = weakref.finalize(self, _close_fd, self._box)
        _live.add(self)

    @property
    def enabled(self) -> bool:
        """Whether the holds are real OS locks (False: locks off or unsupported here)."""
        return self._box[0] is not None

    def _open_locked(self) -> int | None:
        """Open the file and take the version byte, retrying if it was replaced meanwhile;
        None where locks are off or unsupported."""
        if not locks_enabled():
            return None  # nothing to open either
        while True:
            fd = create_file(self.path, self._trust, flags=os.O_RDWR, kind="member-write",
                             exclusive=False)
            try:
                got = attempt(functools.partial(_lock, fd, fcntl.F_RDLCK, VERSION, wait=True))
            except BaseException:
                os.close(fd)
                raise
            if got is None:
                os.close(fd)
                return None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # an evictor removed the version (and this file) meanwhile: again

    @property
    def held(self) -> frozenset[int]:
        """Shards this process holds."""
        return frozenset(self._counts)

    def hold(self, k: int) -> None:
        """Hold shard ``k`` (waits only while an evictor is deleting it)."""
        with self._lock:
            count = self._counts.get(k, 0)
            fd = self._box[0]
            if count == 0 and fd is not None:
                _lock(fd, fcntl.F_RDLCK, k, wait=True)
            self._counts[k] = count + 1

    def release(self, k: int) -> None:
        """Drop one hold on shard ``k``."""
        with self._lock:
            count = self._counts.get(k, 0)
            if count <= 1:
                self._counts.pop(k, None)
                fd = self._box[0]
                if count == 1 and fd is not None:
                    _lock(fd, fcntl.F_UNLCK, k, wait=False)
            else:
                self._counts[k] = count - 1

    @contextlib.contextmanager
    def fetching(self, k: int) -> Iterator[None]:
        """Exclude other processes from downloading shard ``k`` (waits for the one that is)."""
        fd = self._box[0]
        if fd is None:
            yield
            return
        _lock(fd, fcntl.F_WRLCK, FETCH + k, wait=True)
        try:
            yield
        finally:
            _lock(fd, fcntl.F_UNLCK, FETCH + k, wait=False)

    def close(self) -> None:
        """Drop every hold (the process's mappings of this version must be gone)."""
        self._counts.clear()
        self._finalizer()

    def _after_fork(self) -> None:
        """In a forked child: a description of its own, holding what the parent held."""
        self._lock = threading.Lock()
        inherited = self._box[0]
        if inherited is None:
            return
        self._box[0] = fd = self._open_locked()
        if fd is not None:
            for k in self._counts:
                _lock(fd, fcntl.F_RDLCK, k, wait=True)
        os.close(inherited)  # the parent's description and its locks live on in the parent


def _close_fd(box: list[int | None]) -> None:
    fd, box[0] = box[0], None
    if fd is not None:
        os.close(fd)


def _reopen_in_child() -> None:
    for holds in list(_live):
        holds._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reopen_in_child)


def try_lock_range(fd: int, start: int, length: int) -> bool | None:
    """Lock ``[start, start + length)`` of ``fd`` exclusively without waiting (``length`` 0:
    the whole file, however long).

    Returns True if taken, False if another description holds part of it,
    None if this filesystem cannot lock (or locks are off).
    """
    return attempt(functools.partial(_lock, fd, fcntl.F_WRLCK, start, length, wait=False))


def unlock_range(fd: int, start: int, length: int) -> None:
    """Release a lock taken with :func:`try_lock_range`."""
    _lock(fd, fcntl.F_UNLCK, start, length, wait=False)
