"""Workers forked from the building process: when that is safe, the fork, the process.

A fresh interpreter costs a worker about a sixth of a second of CPU before its first item
(starting Python, importing NumPy, Pillow and the package again), time in which the other
core computes alone. A worker forked from the building process has all of that already:
it starts in milliseconds. Forking is safe only where no other thread can hold a lock the
child would need, so a pool forks its workers (:func:`fork_allowed`) only

* on Linux (elsewhere: macOS's system libraries are not safe to use after a fork);
* when the building process runs no Python thread but the one building: no notebook
  kernel, no thread of the caller's, no metrics or heartbeat thread. The native pools a
  process may run (NumPy's OpenBLAS, torch's intra-op threads) prepare themselves for a
  fork (``pthread_atfork``), as every forked ``DataLoader`` worker relies on;
* when torch has not initialized CUDA (a forked child cannot use it);
* for a pool of the build's own loader (a device worker gets an environment and a set-up of
  its own, which only a fresh interpreter honours);
* unless ``$TSC_WORKER_START`` is ``spawn``.

A forked worker is what a fresh one is, but for its start: SIGINT is ignored from its
first statement (it is blocked across the fork, so a Ctrl-C cannot land in between) and
every other signal the caller handles in Python gets its default action back (a SIGTERM
handler that saves a checkpoint is the caller's, not its workers'), its standard input reads
nothing, it holds no end of another worker's pipes, it takes the
pool's environment, and it runs :func:`~.procs.serve_tasks`. It leaves by
:func:`os._exit`, its standard streams flushed: the building process's exit handlers and
the buffers of its open files, which the child holds copies of, are never run or flushed
twice (the building process flushes its standard streams before it forks).
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

__all__ = ["Forked", "fork_allowed", "fork_worker"]

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
    return not (callable(initialized) and initialized())


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
    rx: int, tx: int, close: list[int], env: Mapping[str, str], serve: Callable[[int, int], None]
) -> Forked:
    """Fork a worker that runs ``serve(rx, tx)`` with environment ``env`` after closing the
    descriptors ``close`` (the building process's ends of every worker's pipes)."""
    import warnings

    for stream in (sys.stdout, sys.stderr):  # else the child would write their buffers too
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # the child's collections then never look at the objects it shares with this process
    # (which would copy their pages)
    gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns about a fork by a process with threads: the only ones
            # here are native pools that prepare for it (see fork_allowed)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _child(rx, tx, close, env, serve, mask)
    finally:
        gc.unfreeze()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return Forked(pid)


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
        os.dup2(null, 0)
        os.close(null)
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
