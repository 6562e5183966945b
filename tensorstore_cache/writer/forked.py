"""Workers forked from the building process: when that is safe, the fork, the process.

A fresh interpreter costs a worker about a sixth of a second of CPU before its first item
(starting Python, importing NumPy, Pillow and the package again), time in which the other
core computes alone. A worker forked from the building process has all of that already:
it starts in milliseconds. A forked child shares what its parent holds, so a pool forks its
workers (:func:`fork_allowed`) only

* on Linux (elsewhere: macOS's system libraries are not safe to use after a fork);
* when the building process runs no Python thread but the one building: no notebook
  kernel, no thread of the caller's, no metrics or heartbeat thread (a thread holding a
  lock at the fork would leave it held forever in the child);
* when it holds no open regular file or socket but lock files and socket pairs
  (:func:`shared_files`): a file read through a shared descriptor has one offset for both
  processes, a socket one stream, so a zip archive, an HDF5 or SQLite file or a connection
  opened before the build would give either process the other's bytes;
* when no GNU OpenMP runtime is loaded but torch's (:func:`foreign_openmp`): one whose
  threads ran before the fork makes the child's next parallel region wait forever for
  them. Torch's is tamed in the child, which computes torch on one thread (as a forked
  ``DataLoader`` worker does); NumPy's OpenBLAS prepares itself for a fork;
* when torch has not initialized CUDA (a forked child cannot use it);
* for a pool without an environment or a set-up of its own (a batch loader's device
  workers have both, which only a fresh interpreter honours);
* unless ``$TSC_WORKER_START`` is ``spawn``.

Native threads of other libraries are not seen (OpenCV's pool is one that does not survive a
fork); ``TSC_WORKER_START=spawn`` is the way out. If the system refuses the fork (memory,
process limits) the worker starts fresh.

A forked worker is what a fresh one is, but for its start: SIGINT is ignored from its
first statement (it is blocked across the fork, so a Ctrl-C cannot land in between) and
every other signal the caller handles in Python gets its default action back (a SIGTERM
handler that saves a checkpoint is the caller's, not its workers'); its standard input
reads nothing; it holds no end of another worker's pipes, nor the caller's lock files
(those locks end with the caller, whatever its workers do); NumPy's global generator gets a
seed of its own; it takes the pool's environment and runs :func:`~.procs.serve_tasks`. It
leaves by :func:`os._exit`, its standard streams flushed, as a ``multiprocessing`` child
forked does: the building process's exit handlers and the buffers of its open files, which
the child holds copies of, are never run or written twice (the building process flushes
its standard streams before it forks), and no exit handler runs in it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

# not `from .. import config`: a fresh worker has not run the package's __init__ (procs.BOOT)
from ..config import WORKER_START_ENV

__all__ = ["Forked", "foreign_openmp", "fork_allowed", "fork_worker", "shared_files"]

_STARTS = ("", "auto", "spawn")


def fork_allowed() -> bool:
    """Whether a pool of the build's own loader forks its workers from this process now.

    Raises
    ------
    ValueError
        If ``$TSC_WORKER_START`` is set to something other than ``auto`` or ``spawn``.
    """
    name = WORKER_START_ENV
    raw = os.environ.get(name, "")
    start = raw.strip().lower()
    if start not in _STARTS:
        raise ValueError(f"${name} must be 'auto' or 'spawn', got {raw!r}: unset it, "
                         "or set it to 'spawn' to start every worker as a fresh interpreter")
    if start == "spawn" or sys.platform != "linux" or threading.active_count() != 1:
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    initialized = getattr(cuda, "is_initialized", None)
    if callable(initialized) and initialized():
        return False
    return not shared_files() and not foreign_openmp()


def shared_files() -> list[str]:
    """What a forked child would share with this process and could disturb: every regular
    file and socket open here (past the standard streams) but lock files (a descriptor
    holding a lock: the build's own, a reader's holds) and socket pairs (a Unix socket whose
    peer has no name: a ``multiprocessing`` connection to a related process), by name.

    A file read through a shared descriptor has one offset for both processes (a zip
    archive, an HDF5 or SQLite file opened before the build), a socket one stream (a
    database or HTTP connection): a fresh worker opens its own.
    """
    import stat

    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ["/proc/self/fd (unreadable)"]
    shared = []
    for name in names:
        fd = int(name)
        try:
            mode = os.fstat(fd).st_mode
            if fd < 3 or not (stat.S_ISREG(mode) or stat.S_ISSOCK(mode)):
                continue
            if stat.S_ISSOCK(mode) and _socket_pair(fd):
                continue
            if stat.S_ISREG(mode) and _holds_lock(fd):
                continue
            shared.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed since
            continue
    return shared


def _socket_pair(fd: int) -> bool:
    """Whether ``fd`` is a connected Unix socket whose peer has no name (a socket pair)."""
    import socket

    sock = socket.socket(fileno=fd)
    try:
        return sock.family == socket.AF_UNIX and not sock.getpeername()
    except OSError:  # not connected (listening, or never): not a pair
        return False
    finally:
        sock.detach()


def foreign_openmp() -> list[str]:
    """The GNU OpenMP runtimes mapped in this process but torch's, whose thread pools do not
    survive a fork (a child's next parallel region would wait forever for them); torch's is
    tamed in the child (one thread, as a forked ``DataLoader`` worker has)."""
    torch = sys.modules.get("torch")
    home = os.path.dirname(getattr(torch, "__file__", None) or "/nonexistent") + os.sep
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            found = {line.split(None, 5)[-1].strip() for line in maps if "libgomp" in line}
    except OSError:
        return ["/proc/self/maps (unreadable)"]
    return sorted(path for path in found if not path.startswith(home))


class Forked:
    """A forked worker process: as much of :class:`subprocess.Popen` as a pool uses.

    Parameters
    ----------
    pid
        The child's process id.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._reaping = threading.Lock()

    def poll(self) -> int | None:
        """The exit code (``-N``: killed by signal ``N``), or None while it runs (or while
        another thread waits for it)."""
        if self.returncode is None and self._reaping.acquire(blocking=False):
            try:
                self._reap(os.WNOHANG)
            finally:
                self._reaping.release()
        return self.returncode

    def _reap(self, flags: int) -> None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # SIGCHLD ignored here: reaped already, status unknown
                self.returncode = 0
                return
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; its exit code.

        Raises
        ------
        subprocess.TimeoutExpired
            If it still runs after ``timeout`` seconds.
        """
        if timeout is None:
            with self._reaping:
                self._reap(0)
        deadline = time.monotonic() + (timeout or 0.0)
        delay = 0.0005
        while (code := self.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                import subprocess

                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return code

    def kill(self) -> None:
        """Send it SIGKILL, unless it was reaped (its pid may then be another's)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def fork_worker(
    rx: int, tx: int, close: list[int], env: Mapping[str, str],
    serve: Callable[[int, int], None], started: Callable[[Forked], None],
) -> None:
    """Fork a worker that runs ``serve(rx, tx)`` with environment ``env`` after closing the
    descriptors ``close`` (the building process's ends of every worker's pipes); its handle
    goes to ``started`` while SIGINT is still blocked (a Ctrl-C then cannot lose it).

    Raises
    ------
    OSError
        If the system refuses the fork (memory, process limits).
    """
    import warnings

    for stream in (sys.stdout, sys.stderr):  # else the child would write their buffers too
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # the child's collections then never look at the objects it shares with this process
    # (which would copy their pages)
    frozen = gc.get_freeze_count() == 0  # the caller's own freeze is left as it is
    if frozen:
        gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about a fork by a process with threads: the only ones
            # here are native pools that prepare for it (see fork_allowed)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _child(rx, tx, close, env, serve, mask)
        started(Forked(pid))
    finally:
        if frozen:
            gc.unfreeze()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _holds_lock(fd: int) -> bool:
    """Whether this process holds a lock (``flock`` or POSIX) on a file through ``fd``."""
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        return any(line.startswith("lock:") for line in info)


def _lock_files() -> list[int]:
    """The descriptors through which this process holds a lock on a file."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
            if _holds_lock(int(name)):
                out.append(int(name))
    return out


def _as_fresh() -> None:
    """What a fresh interpreter would have that a forked child does not: its own random
    seed for NumPy's global generator (the standard library's ``random`` is reseeded by
    Python itself), and torch computing on one thread (its OpenMP pool is not the child's)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    set_threads = getattr(sys.modules.get("torch"), "set_num_threads", None)
    if callable(set_threads):
        set_threads(1)


def _child(rx: int, tx: int, close: list[int], env: Mapping[str, str],
           serve: Callable[[int, int], None], mask: set[int | signal.Signals]) -> NoReturn:
    """The forked worker's life, which ends in :func:`os._exit` whatever happens."""
    code = 1
    try:
        for signum in signal.valid_signals():  # the caller's handlers are not a worker's
            with contextlib.suppress(OSError, ValueError):
                if callable(signal.getsignal(signum)):
                    signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in close:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        # stdin reads nothing; this process's copies of the lock files' descriptors go (the
        # caller's locks stay the caller's, and end with it even while a worker lives)
        for fd in [0, *_lock_files()]:
            os.dup2(null, fd)
        os.close(null)
        _as_fresh()
        for name in [n for n in os.environ if n not in env]:
            del os.environ[name]
        os.environ.update({n: v for n, v in env.items() if os.environ.get(n) != v})
        serve(rx, tx)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                if stream is not None:
                    stream.flush()
        os._exit(code)
