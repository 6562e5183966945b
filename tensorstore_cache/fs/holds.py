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
``k`` without waiting, so never while a process maps it; a whole version
only after locking every byte. The kernel drops a dead process's locks,
``SIGKILL`` included. OFD locks belong to the open file description, so
unlike POSIX ``fcntl`` locks they conflict between two descriptors of one
process (two stores, or a store and the evictor). A forked child shares its
parent's description: every live :class:`HoldFile` gets a description of its
own in the child (``os.register_at_fork``) before anything can unlock the
parent's bytes.

Where locks are off (``TSC_CACHE_LOCKS=0``) or unsupported, holds are
empty and evictors fall back to a grace period.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from .locks import UNSUPPORTED_ERRNOS, locks_enabled
from .trust import Trust, create_file

__all__ = ["FETCH", "VERSION", "HoldFile", "probe_exclusive", "unlock"]

#: First byte of the download locks (``FETCH + k`` for shard ``k``).
FETCH = 1 << 40
#: The byte every process that has the version open holds shared.
VERSION = 1 << 41
_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)


def _lock(fd: int, kind: int, start: int, length: int = 1, *, wait: bool) -> bool:
    """Apply one OFD lock operation; False if another description holds a conflicting lock."""
    arg = struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)
    try:
        fcntl.fcntl(fd, _SETLKW if wait else _SETLK, arg)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


_live: weakref.WeakSet[HoldFile] = weakref.WeakSet()


class HoldFile:
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
        self._box = [self._open_locked() if locks_enabled() else -1]
        self._finalizer = weakref.finalize(self, _close_fd, self._box)
        _live.add(self)

    @property
    def _fd(self) -> int:
        return self._box[0]

    @property
    def enabled(self) -> bool:
        """Whether the holds are real OS locks (False: locks off or unsupported here)."""
        return self._fd >= 0

    def _open_locked(self) -> int:
        """Open the file and take the version byte, retrying if it was replaced meanwhile."""
        while True:
            fd = create_file(self.path, self._trust, flags=os.O_RDWR, kind="member-write",
                             exclusive=False)
            try:
                _lock(fd, fcntl.F_RDLCK, VERSION, wait=True)
            except OSError as exc:
                os.close(fd)
                if exc.errno in UNSUPPORTED_ERRNOS:
                    return -1
                raise
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
            if count == 0 and self._fd >= 0:
                _lock(self._fd, fcntl.F_RDLCK, k, wait=True)
            self._counts[k] = count + 1

    def release(self, k: int) -> None:
        """Drop one hold on shard ``k``."""
        with self._lock:
            count = self._counts.get(k, 0)
            if count <= 1:
                self._counts.pop(k, None)
                if count == 1 and self._fd >= 0:
                    _lock(self._fd, fcntl.F_UNLCK, k, wait=False)
            else:
                self._counts[k] = count - 1

    @contextlib.contextmanager
    def fetching(self, k: int) -> Iterator[None]:
        """Exclude other processes from downloading shard ``k`` (waits for the one that is)."""
        if self._fd < 0:
            yield
            return
        _lock(self._fd, fcntl.F_WRLCK, FETCH + k, wait=True)
        try:
            yield
        finally:
            _lock(self._fd, fcntl.F_UNLCK, FETCH + k, wait=False)

    def close(self) -> None:
        """Drop every hold (the process's mappings of this version must be gone)."""
        self._counts.clear()
        self._finalizer()

    def _after_fork(self) -> None:
        """In a forked child: a description of its own, holding what the parent held."""
        self._lock = threading.Lock()
        inherited = self._fd
        if inherited < 0:
            return
        self._box[0] = fd = self._open_locked()
        for k in self._counts:
            if fd >= 0:
                _lock(fd, fcntl.F_RDLCK, k, wait=True)
        os.close(inherited)  # the parent's description and its locks live on in the parent


def _close_fd(box: list[int]) -> None:
    fd, box[0] = box[0], -1
    if fd >= 0:
        os.close(fd)


def _reopen_in_child() -> None:
    for hold in list(_live):
        hold._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reopen_in_child)


def probe_exclusive(fd: int, start: int, length: int = 1) -> bool | None:
    """Lock ``[start, start + length)`` of ``fd`` exclusively without waiting.

    Returns True if taken, False if another description holds part of it,
    None if this filesystem cannot lock (or locks are off).
    """
    if not locks_enabled():
        return None
    try:
        return _lock(fd, fcntl.F_WRLCK, start, length, wait=False)
    except OSError as exc:
        if exc.errno in UNSUPPORTED_ERRNOS:
            return None
        raise


def unlock(fd: int, start: int, length: int = 1) -> None:
    """Release a lock taken with :func:`probe_exclusive`."""
    _lock(fd, fcntl.F_UNLCK, start, length, wait=False)
