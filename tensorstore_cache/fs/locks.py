"""OS file locks: the build lock of a cache namespace and readers' holds on parts.

The build lock is an exclusive ``flock`` on a lock file. The kernel releases
it when its holder exits, however it exits (``SIGKILL`` included), so a dead
builder never blocks anybody. The holder writes ``pid host start-time`` into
the file so that waiters can say whom they wait for.

Readers take a *shared* ``flock`` on the ``zarr.json`` of every part they
map; housekeeping deletes an unreferenced part only if it can take an
exclusive lock on it, i.e. when no process maps it any more.

Filesystems without working locks (some NFS mounts, some FUSE filesystems)
make ``flock`` fail with ``ENOLCK``/``EOPNOTSUPP``; the lock then reports
that it is *not* held and callers rely on the atomic first-writer-wins
publication of manifests instead. Setting ``TSC_CACHE_LOCKS=0`` turns locking
off deliberately (for mounts where ``flock`` hangs).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .. import config
from ..errors import StoreLockedError

__all__ = [
    "BuildLock",
    "Holder",
    "ReaderHold",
    "locks_enabled",
    "read_holder",
    "try_exclusive",
]

# errno values meaning "this filesystem cannot lock", as opposed to "someone holds it"
_UNSUPPORTED = frozenset(
    e for e in (
        errno.ENOLCK,
        errno.EOPNOTSUPP,
        getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
        errno.ENOSYS,
        errno.EINVAL,
        errno.EBADF,
    )
)


def locks_enabled() -> bool:
    """Whether file locks are used (``TSC_CACHE_LOCKS`` is not ``0``/``off``/``false``/``no``)."""
    return os.environ.get(config.LOCKS_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a build lock, as written in its lock file."""

    pid: int
    """Process id of the holder (on ``host``)."""
    host: str
    """Host name of the holder."""
    since: float
    """When it took the lock, seconds since the epoch."""
    what: str = "build"
    """What it is doing: ``"build"`` or ``"gc"``."""

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
    try:
        return Holder(int(fields[0]), fields[1], float(fields[2]), fields[3] if len(fields) > 3 else "build")
    except ValueError:
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class BuildLock:
    """An exclusive, process-wide ``flock`` on ``path`` that dies with its holder.

    Parameters
    ----------
    path
        The lock file (created if missing).
    prepare
        Called before every attempt to open the lock file; it recreates the
        lock file's directory if housekeeping removed it meanwhile.
    what
        Written into the lock file for waiters to read (``"build"``, ``"gc"``).

    Notes
    -----
    ``flock`` locks belong to an open file description, so two threads of
    one process exclude each other too. After taking the lock, the lock file
    is checked to still be the file at ``path`` (housekeeping may have moved
    the namespace away meanwhile); if not, the lock is retaken.
    """

    def __init__(
        self, path: Path, *, prepare: Callable[[], None] | None = None, what: str = "build"
    ) -> None:
        self.path = path
        self._prepare = prepare
        self._what = what
        self._fd: int | None = None
        self.held = False
        """True while the OS lock is held; False when unsupported or released."""

    def _open(self) -> int:
        if self._prepare is not None:
            self._prepare()
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def _claim(self, fd: int) -> None:
        self._fd = fd
        self.held = True
        info = f"{os.getpid()} {socket.gethostname()} {time.time():.3f} {self._what}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError:
            pass  # the holder description is informative only

    def try_acquire(self) -> bool | None:
        """Take the lock without waiting.

        Returns
        -------
        bool or None
            True if taken, False if another process holds it, None if this
            filesystem does not support locks (or locks are turned off).
        """
        if not locks_enabled():
            return None
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError as exc:
                os.close(fd)
                if exc.errno in _UNSUPPORTED:
                    return None
                raise
            if _same_file(fd, self.path):
                self._claim(fd)
                return True
            os.close(fd)  # the file was moved or replaced while we locked it: retry

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

    def release(self) -> None:
        """Release the lock (a no-op if it is not held)."""
        fd, self._fd = self._fd, None
        self.held = False
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> BuildLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ReaderHold:
    """A shared ``flock`` on a part's ``zarr.json``: "this process maps the part".

    Released by :meth:`close` or when the process exits. Failing to lock
    (unsupported filesystem, locks turned off) is not an error: the hold is
    then empty and housekeeping falls back to its grace period.
    """

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        if not locks_enabled():
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a collector deletes the part
        except OSError:
            os.close(fd)
            return
        self._fd = fd
        # a store dropped without close() releases its hold when it is collected
        self._finalizer = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        """Release the hold."""
        if self._fd is not None:
            self._fd = None
            self._finalizer()


def try_exclusive(path: Path) -> tuple[bool, int | None]:
    """Find out whether any process holds ``path`` (shared or exclusive), without waiting.

    Returns
    -------
    free : bool
        False if a process holds a lock on the file, or the file cannot be
        opened for writing (then nobody can tell). True otherwise.
    fd : int or None
        When ``free``, an open descriptor holding an exclusive lock that the
        caller closes after deleting the file; None where locks are turned off
        or unsupported (then only the caller's grace period protects users).
    """
    try:
        fd = os.open(path, os.O_RDWR)  # NFS emulates flock with POSIX locks: needs write access
    except OSError:
        return False, None
    if not locks_enabled():
        os.close(fd)
        return True, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False, None
    except OSError as exc:
        os.close(fd)
        if exc.errno in _UNSUPPORTED:
            return True, None
        return False, None
    return True, fd
