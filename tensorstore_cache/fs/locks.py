"""OS file locks that die with their holder: one vocabulary, one rule for filesystems without locks.

The kernel releases every lock here when its holder exits, however it exits
(``SIGKILL`` included), so a dead process never blocks anybody.

:class:`ExclusiveLock`
    An exclusive ``flock`` on a lock file: a namespace's build lock (``gc``
    takes it too), a remote store's fetch lock, the node cache's eviction
    lock. The holder writes ``pid host start-time what`` into the file so
    that waiters can say whom they wait for (:func:`read_holder`);
    :func:`is_held` asks without taking it.
:class:`SharedHold`
    A shared ``flock`` on a file a process reads: readers hold the
    ``zarr.json`` of every part they map, and housekeeping deletes a part
    only if it can take an exclusive lock on it (:func:`try_exclusive`),
    i.e. when no process maps it any more.
:class:`~tensorstore_cache.fs.ranges.RangeHolds`
    Byte-range locks on one file, one byte per purpose: the holds on a
    remote store's shards in the node cache.

One rule for all of them, :func:`attempt`. With ``TSC_CACHE_LOCKS=0`` (for
mounts where ``flock`` hangs) nothing is locked. On a filesystem without
working locks (some NFS and FUSE mounts: ``ENOLCK``, ``EOPNOTSUPP``, ...) a
lock reports that it is *not held*, and its users fall back: builders on the
atomic first-writer-wins publication of manifests, housekeeping on a grace
period. A lock another process holds is reported as such; any other error is
raised.

The ``flock`` kinds share one base, :class:`FileLock`, that opens the file,
takes the lock under that rule and releases it; each kind says how its file
is opened, which lock it takes and how it lets go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import socket
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar

from .. import config
from ..errors import StoreLockedError
from .opens import create_file
from .trust import EXPLICIT, Trust

__all__ = [
    "ExclusiveLock",
    "FileLock",
    "Holder",
    "SharedHold",
    "UNSUPPORTED_ERRNOS",
    "attempt",
    "is_held",
    "locks_enabled",
    "read_holder",
    "try_exclusive",
]

#: errno values meaning "this filesystem cannot lock", as opposed to "someone holds it".
UNSUPPORTED_ERRNOS = frozenset(
    e for e in (
        errno.ENOLCK,
        errno.EOPNOTSUPP,
        getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
        errno.ENOSYS,
        errno.EINVAL,
        errno.EBADF,
    )
)
#: errno values of a lock that another holder has (``flock``: EWOULDBLOCK; ``fcntl``: EACCES too).
_BUSY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
#: Opens of a lock file whose directory housekeeping keeps removing meanwhile.
_VANISHED_ATTEMPTS = 50
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def locks_enabled() -> bool:
    """Whether file locks are used (``TSC_CACHE_LOCKS`` is not ``0``/``off``/``false``/``no``)."""
    return os.environ.get(config.LOCKS_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def attempt(lock: Callable[[], object]) -> bool | None:
    """Run one lock operation under the package's rule for locks.

    Returns
    -------
    bool or None
        True if the lock was taken; False if another holder has a
        conflicting lock; None if locks are turned off (nothing was tried)
        or this filesystem cannot lock.

    Raises
    ------
    OSError
        Any other failure.
    """
    if not locks_enabled():
        return None
    try:
        lock()
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        if exc.errno in UNSUPPORTED_ERRNOS:
            return None
        raise
    return True


class FileLock:
    """An ``flock`` on one file, through one descriptor of this process.

    The base of :class:`ExclusiveLock` and :class:`SharedHold`: a kind sets
    :attr:`operation` and says how its file is opened (:meth:`_open`) and
    what to check once the lock is taken (:meth:`_claim`). A lock whose
    object is collected without :meth:`release` closes its descriptor; a
    ``with`` block releases the lock at its end (taking it is explicit).
    ``flock`` locks belong to an open file description, so two threads of one
    process exclude each other too, and a forked child shares its parent's
    lock until either releases it.
    """

    operation: ClassVar[int]
    """``fcntl.LOCK_EX`` or ``fcntl.LOCK_SH``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._finalizer: weakref.finalize[[int], FileLock] | None = None

    @property
    def held(self) -> bool:
        """True while the OS lock is held; False when unsupported, turned off or released."""
        return self._fd is not None

    def _open(self) -> int | None:
        """Open the file to lock; None if this process cannot (the lock is then not held)."""
        raise NotImplementedError

    def _claim(self, fd: int) -> bool:
        """Called with the lock taken; False if it must be taken again (the file was replaced)."""
        return True

    def _take(self, *, blocking: bool) -> bool | None:
        """Take the lock (see :func:`attempt` for the answer)."""
        if not locks_enabled():
            return None  # nothing to open either
        operation = self.operation if blocking else self.operation | fcntl.LOCK_NB
        while True:
            fd = self._open()
            if fd is None:
                return None
            try:
                got = attempt(functools.partial(fcntl.flock, fd, operation))
            except BaseException:
                os.close(fd)
                raise
            if not got:
                os.close(fd)
                return got
            if self._claim(fd):
                self._fd = fd
                self._finalizer = weakref.finalize(self, os.close, fd)
                return True
            os.close(fd)  # the file was moved or replaced while we locked it: again

    def try_acquire(self) -> bool | None:
        """Take the lock without waiting.

        Returns
        -------
        bool or None
            True if taken, False if another process holds it, None if this
            filesystem does not support locks (or locks are turned off).
        """
        return self._take(blocking=False)

    def _unlock(self, fd: int) -> None:
        """Let go of the lock on ``fd`` (closed afterwards)."""

    def release(self) -> None:
        """Release the lock (a no-op if it is not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self._unlock(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds an exclusive lock, as written in its lock file."""

    pid: int
    """Process id of the holder (on ``host``)."""
    host: str
    """Host name of the holder."""
    since: float
    """When it took the lock, seconds since the epoch."""
    what: str = "build"
    """What it is doing: ``"build"``, ``"gc"``, ``"fetch"``, ``"evict"``."""

    def describe(self) -> str:
        """Return e.g. ``"pid 4242 on host gpu-3 (build, for 12 s)"``."""
        age = max(0.0, time.time() - self.since)
        return f"pid {self.pid} on host {self.host} ({self.what}, for {age:.0f} s)"


def read_holder(path: Path) -> Holder | None:
    """Return who last took the lock at ``path``, or ``None`` if unknown."""
    try:
        with open(path, "rb") as f:
            raw = f.read(512)
    except OSError:
        return None
    fields = raw.decode("utf-8", "replace").split()
    if len(fields) < 3:
        return None
    # written by any user of a shared cache: shown only as short printable text
    host = "".join(c for c in fields[1] if c.isprintable())[:64] or "?"
    what = "".join(c for c in fields[3] if c.isalnum())[:16] if len(fields) > 3 else "build"
    try:
        return Holder(int(fields[0]), host, float(fields[2]), what or "build")
    except ValueError:
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class ExclusiveLock(FileLock):
    """An exclusive, process-wide ``flock`` on ``path`` that dies with its holder.

    Parameters
    ----------
    path
        The lock file (created if missing).
    prepare
        Called before every attempt to open the lock file; it recreates the
        lock file's directory if housekeeping removed it meanwhile.
    what
        Written into the lock file for waiters to read (``"build"``, ``"gc"``, ...).
    trust
        A new lock file gets the policy's mode for files every user writes
        (``0o660`` in a shared cache, so every member can take the lock); an
        existing one is checked like any other file of the cache. Default:
        ``0o644`` through the umask.

    Notes
    -----
    After taking the lock, the lock file is checked to still be the file at
    ``path`` (housekeeping may have moved the namespace away meanwhile); if
    not, the lock is taken again. Releasing unlocks the file explicitly, so
    that forked children still holding its descriptor do not keep the lock.
    """

    operation = fcntl.LOCK_EX

    def __init__(
        self,
        path: Path,
        *,
        prepare: Callable[[], None] | None = None,
        what: str = "build",
        trust: Trust | None = None,
    ) -> None:
        super().__init__(path)
        self._prepare = prepare
        self._what = what
        self._trust = trust or EXPLICIT

    def _open(self) -> int:
        vanished = 0
        while True:
            if self._prepare is not None:
                self._prepare()
            try:
                return create_file(
                    self.path, self._trust, flags=os.O_RDWR, kind="member-write", exclusive=False
                )
            except FileNotFoundError:
                # the lock file's directory was removed between ``prepare`` and the open
                # (housekeeping): ``prepare`` recreates it
                vanished += 1
                if self._prepare is None or vanished >= _VANISHED_ATTEMPTS:
                    raise

    def _claim(self, fd: int) -> bool:
        if not _same_file(fd, self.path):
            return False
        info = f"{os.getpid()} {socket.gethostname()} {time.time():.3f} {self._what}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError:
            pass  # the holder description is informative only
        return True

    def _unlock(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)

    def acquire(
        self,
        *,
        timeout: float | None = None,
        on_wait: Callable[[Holder | None], None] | None = None,
    ) -> bool:
        """Take the lock, waiting for the holder to finish or die.

        Parameters
        ----------
        timeout
            Seconds to wait at most (``None``: no limit).
        on_wait
            Called with the holder's description when waiting starts and
            whenever the holder changes.

        Returns
        -------
        bool
            True if the OS lock is held, False if this filesystem cannot lock
            (the caller must then rely on atomic publication alone).

        Raises
        ------
        StoreLockedError
            If ``timeout`` passed while another process held the lock.
        """
        if timeout is None and on_wait is None:
            return bool(self._take(blocking=True))  # the kernel wakes us when it is free
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        shown: object = ()
        while True:
            got = self.try_acquire()
            if got is None:
                return False
            if got:
                return True
            holder = read_holder(self.path)
            key = None if holder is None else (holder.pid, holder.host, holder.since)
            if on_wait is not None and key != shown:
                shown = key
                on_wait(holder)
            if deadline is not None and time.monotonic() >= deadline:
                who = holder.describe() if holder else "another process"
                raise StoreLockedError(
                    f"waited {timeout} s for the lock {str(self.path)!r}, held by {who}; wait "
                    "longer (lock_timeout=None), or if that process is stuck, stop it (its "
                    "lock is released when it exits)"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def __enter__(self) -> ExclusiveLock:
        return self


class SharedHold(FileLock):
    """A shared ``flock`` on a file this process reads: "this process maps it".

    Taken when made (waiting only while a collector holds the file
    exclusively, to delete it); released by :meth:`close`, when the process
    exits, or when the hold is collected. A file this process cannot open,
    or cannot lock (no locks here, or turned off), is not an error: the hold
    is then empty and housekeeping falls back to its grace period. Closing
    does not unlock the file explicitly: a forked child closing its copy
    leaves its parent's hold in place.
    """

    operation = fcntl.LOCK_SH

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._take(blocking=True)

    def _open(self) -> int | None:
        try:
            return os.open(self.path, os.O_RDONLY | _CLOEXEC)
        except OSError:
            return None

    def close(self) -> None:
        """Release the hold."""
        self.release()


def is_held(path: Path) -> bool | None:
    """Whether a process holds the exclusive lock at ``path`` now, without creating or taking it.

    A shared lock is tried for an instant on a read-only descriptor (a
    process trying to take the lock at that instant just tries again).
    ``None`` when nobody can tell: no lock file, one this process may not
    open, locks turned off or unsupported.
    """
    if not locks_enabled():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None
    try:
        got = attempt(functools.partial(fcntl.flock, fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    finally:
        os.close(fd)
    return None if got is None else not got


def try_exclusive(path: Path) -> tuple[bool, int | None]:
    """Find out whether any process holds ``path`` (shared or exclusive), without waiting.

    Returns
    -------
    free : bool
        False if a process holds a lock on the file, or the file cannot be
        opened (then nobody can tell). True otherwise.
    fd : int or None
        When ``free``, an open descriptor holding an exclusive lock that the
        caller closes after deleting the file; None where locks are turned off
        or unsupported (then only the caller's grace period protects users).
    """
    try:
        fd = os.open(path, os.O_RDWR | _CLOEXEC)  # NFS emulates flock with POSIX locks: needs write access
    except PermissionError:
        try:  # another member's file in a shared cache: local flock needs no write access
            fd = os.open(path, os.O_RDONLY | _CLOEXEC)
        except OSError:
            return False, None
    except OSError:
        return False, None
    try:
        got = attempt(functools.partial(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    if got:
        return True, fd
    os.close(fd)
    return got is None, None
