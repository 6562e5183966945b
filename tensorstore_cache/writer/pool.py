"""A build's own pool of worker processes, safe wherever the caller's code runs.

Workers are forked from the caller's process where that is safe (:mod:`.forked`:
no other Python thread runs there), else started from a clean interpreter
(:mod:`.procs`: ``fork`` immediately followed by ``exec``); either way the
caller's ``__main__`` never runs again, so a script without a main guard, code
read from stdin or ``-c`` and a notebook all work. They start as soon as the
pool is made: while the loader is pickled and the first items are computed here.
The loader travels once per worker, through the pool's initializer, pickled with
cloudpickle: by reference when it can be imported by name, by value
otherwise (a function of ``__main__`` or of a notebook cell, a lambda, a
closure, a :func:`functools.partial` of a local function). Each worker

* ignores SIGINT: a terminal's Ctrl-C reaches the whole process group, and
  the builder, which handles it, kills its workers (:meth:`BuildPool.abort`);
* exits as soon as its builder dies (``SIGKILL``, ``SIGTERM``, out of memory),
  instead of computing on for nobody;
* inherits ``TSC_BUILDING`` (:mod:`.reentry`), so that nothing it runs can
  wait for the lock its builder holds;
* writes the shard it is building into a status file named by its pid, so
  that the builder can name that shard and its first source if the worker
  dies;
* exits without the interpreter's teardown once it has served its build
  (:mod:`.quick_exit`).

A build owns its pool (its initializer carries the build's loader); the
pool ends with the build, and is killed, not waited for, when the build is
interrupted, or when the build is done before a worker was ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import BrokenExecutor, Future
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..fs import discard_tree
from .forked import fork_allowed
from .frames import loader_frames
from .pieces import Piece, run_unit
from .procs import Workers
from .reentry import worker_environment
from .tasks import Computed, ShardResult, ShardTask

__all__ = ["BuildPool", "WorkerStartError", "ship_loader"]

#: Directory of a build (beside ``vectors/``) where the workers say which shard they build.
STATUS_DIR = ".tsc-workers"
#: How often a worker checks that its builder is alive (seconds).
PARENT_POLL_S = 0.1
#: How long :meth:`BuildPool.abort` waits for a killed worker to be reaped (seconds).
KILL_WAIT_S = 5.0


class WorkerStartError(BrokenExecutor):
    """A pool's worker could not load the build's loader (raised by its tasks)."""


def ship_loader(loader: object) -> bytes:
    """Pickle ``loader`` for the workers: by reference if importable by name, else by value.

    Raises
    ------
    TypeError
        If the loader cannot be pickled at all (it holds a lock, an open
        connection, ...).
    """
    import cloudpickle

    try:
        payload: bytes = cloudpickle.dumps(loader)
    except Exception as exc:
        raise TypeError(
            f"the loader {loader!r} cannot be sent to worker processes ({type(exc).__name__}: "
            f"{exc}); make it picklable (open files, connections or models inside the call, or "
            "lazily on first use, rather than holding them), or pass workers=1"
        ) from None
    return payload


# -- in a worker ---------------------------------------------------------------------

_loader: Any = None
_start_error: str | None = None
_status_fd: int | None = None


def _exit_with_parent(builder: int) -> None:
    """In a pool worker: exit as soon as the building process dies.

    A worker blocks on the task queue, whose write end every worker also
    holds, so it would never see the builder vanish (``SIGKILL``,
    ``SIGTERM``, out of memory) and would linger, or compute on, forever. A
    daemon thread watches for the worker being orphaned instead; whatever it
    was writing lies in the dead build's directory, which ``collect_debris``
    removes. ``builder`` is the pid of the building process, given by it: a
    worker whose builder died while it started is already an orphan here.
    """

    def watch() -> None:
        while os.getppid() == builder:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="tsc-exit-with-parent", daemon=True).start()


def _bootstrap(
    payload: bytes, status_dir: str, builder: int, setup: Callable[[], None] | None = None
) -> None:
    """The pool's initializer: run once in every worker before its first task (``setup``
    first of all, before the loader is unpickled: the exit handlers it registers run after
    the loader's)."""
    global _loader, _start_error, _status_fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if setup is not None:
        setup()
    _exit_with_parent(builder)
    with contextlib.suppress(OSError):
        _status_fd = os.open(
            os.path.join(status_dir, str(os.getpid())), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
    try:
        _loader = pickle.loads(payload)
    except BaseException as exc:  # reported by every task of this worker
        where = loader_frames(exc)
        _start_error = f"{type(exc).__name__}: {exc}" + (f"\n{where}" if where else "")


def _status(rel: str) -> None:
    if _status_fd is None:
        return
    data = rel.encode()
    with contextlib.suppress(OSError):
        os.ftruncate(_status_fd, len(data))
        os.pwrite(_status_fd, data, 0)


def _call_pooled(fn: Callable[..., None], status: str, *args: Any) -> None:
    """Call ``fn(loader, *args)`` with the loader this worker received when it started,
    saying ``status`` meanwhile."""
    if _start_error is not None:
        raise WorkerStartError(_start_error)
    _status(status)
    fn(_loader, *args)
    _status("")


def _run_pooled(unit: ShardTask | Piece) -> ShardResult | Computed:
    """Run one shard task, or compute one piece of a shard, with the loader this worker
    received when it started."""
    if _start_error is not None:
        raise WorkerStartError(_start_error)
    _status(unit.task.rel if isinstance(unit, Piece) else unit.rel)
    done = run_unit(unit, _loader)
    _status("")
    return done


# -- in the builder ------------------------------------------------------------------


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (in the main thread) until the block is done, then deliver it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    received: list[int] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)


def _fate(code: int | None) -> str:
    if code is None:
        return "died"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"died by signal {-code}"
        return f"died by signal {-code} ({name})"
    return f"exited with code {code}"


class BuildPool:
    """``size`` worker processes that build shards with ``loader``.

    Parameters
    ----------
    size
        Number of worker processes.
    loader
        The build's loader (or the stage of a batched build), sent to every worker once.
    build_dir
        The build's temporary directory, where :data:`STATUS_DIR` holds the
        workers' status files until :meth:`close` or :meth:`abort`.
    status_dir
        Where the status files go instead (created, removed by :meth:`close`
        or :meth:`abort`): the workers of a batched build, started before its
        directory exists, have their own.
    env
        Environment variables the workers get besides those of this process.
    setup
        A function (importable by name) each worker calls first when it starts,
        before it unpickles the loader: a device worker's set-up
        (:func:`~.device.server.device_worker_setup`).
    """

    def __init__(
        self, size: int, loader: object, build_dir: Path, *, status_dir: Path | None = None,
        env: Mapping[str, str] | None = None, setup: Callable[[], None] | None = None,
    ) -> None:
        status_dir = build_dir / STATUS_DIR if status_dir is None else status_dir
        self.size = size
        self._assigned = 0  # tasks given a worker of their own so far (see submit)
        self._status_dir = status_dir
        # the workers start first: fresh ones import while the loader is pickled here
        fork = env is None and setup is None and fork_allowed()
        self._executor = Workers(size, {**os.environ, **(env or {}), **worker_environment()},
                                 fork=fork)
        try:
            payload = ship_loader(loader)
            status_dir.mkdir()
        except BaseException:
            self._executor.kill()
            raise
        self._executor.start(_bootstrap, (payload, str(status_dir), os.getpid(), setup))

    def submit(self, unit: ShardTask | Piece) -> Future[Any]:
        """Queue a shard task, or a piece of one (its loader is left out: the workers have
        theirs), whose future gives its :class:`~.tasks.ShardResult`, or the piece's rows;
        the first :attr:`size` go one to each worker, which takes it first: every worker
        takes part in the build."""
        sent = (Piece(dataclasses.replace(unit.task, loader=None), unit.start)
                if isinstance(unit, Piece) else dataclasses.replace(unit, loader=None))
        future: Future[Any]
        if self._assigned < self.size:
            future = self._executor.assign(self._assigned, _run_pooled, sent)
            self._assigned += 1
        else:
            future = self._executor.submit(_run_pooled, sent)
        return future

    def call(self, fn: Callable[..., None], *args: Any, status: str) -> Future[None]:
        """Have one worker call ``fn(loader, *args)`` (importable by name) with its loader,
        its status file saying ``status`` meanwhile (a device worker serving its device:
        it takes no other task until ``fn`` returns)."""
        future: Future[None] = self._executor.submit(_call_pooled, fn, status, *args)
        return future

    def stop(self) -> None:
        """Let the workers exit once every task is done, and return at once (:meth:`close`
        then waits for them)."""
        self._executor.shutdown(wait=False)

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Let the workers finish and exit (after every task is done; one still starting
        then is killed); ``wait`` for them.

        With ``timeout``: wait at most that many seconds for every worker to exit, then
        kill those left (a worker tearing down a model that will not let go).
        """
        self._executor.shutdown(wait=False)
        if wait and not self._executor.join(timeout):
            self.abort()
        discard_tree(self._status_dir)

    def abort(self) -> None:
        """Kill every worker at once (running shards are abandoned) and reap them."""
        with _interrupts_deferred():
            self._executor.kill()
            discard_tree(self._status_dir)

    def _building(self, pid: int) -> str:
        try:
            return (self._status_dir / str(pid)).read_text()
        except OSError:
            return ""

    def explain(self, exc: BaseException, left: list[ShardTask]) -> BaseException:
        """The :class:`BuildError` of a pool that broke (given the unfinished tasks)."""
        if isinstance(exc, WorkerStartError):
            return BuildError(
                "the build's worker processes could not load the loader, so nothing was "
                f"published: {exc}\nA loader that can be imported by name is sent to the "
                "workers by reference: its module must import in a fresh Python process "
                "(installed, or on sys.path) and must not fail or build at import. "
                "Fix that, or pass workers=1 to build in this process."
            )
        by_rel = {t.rel: t for t in left}
        dead = []
        for worker in self._executor.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(KILL_WAIT_S)  # the others are killed: their codes are final
            dead.append((worker.pid, worker.process.returncode, self._building(worker.pid)))
        busy = [(pid, code, rel) for pid, code, rel in dead if rel]
        # the remaining workers are killed with SIGKILL once one died: another
        # fate singles out the worker that died first
        odd = [d for d in busy if d[1] != -signal.SIGKILL]
        if len(odd) == 1 or len(busy) == 1:
            (pid, code, rel), = odd if len(odd) == 1 else busy
            what = f"the worker process (pid {pid}) building {self._shard(rel, by_rel)} {_fate(code)}"
        elif busy:
            codes = sorted({_fate(code) for _pid, code, _rel in busy})
            shards = "; ".join(self._shard(rel, by_rel) for _pid, _code, rel in busy)
            what = (f"a worker process {' or '.join(codes)} while the workers were building: "
                    f"{shards}")
        else:
            fates = ", ".join(f"pid {pid} {_fate(code)}" for pid, code, _rel in dead) or "-"
            what = f"a worker process died before it took a shard ({fates}): {exc}"
        return BuildError(
            f"{what}; nothing was published. A signal such as SIGSEGV or SIGABRT means the "
            "loader crashed the interpreter on a source of that shard (build it with workers=1 "
            "to find which); SIGKILL usually means the system ran out of memory (use fewer "
            "workers) or someone killed the process."
        )

    @staticmethod
    def _shard(rel: str, by_rel: dict[str, ShardTask]) -> str:
        task = by_rel.get(rel)
        if task is None or not task.keys:
            return f"shard {rel}"
        return f"shard {rel} ({len(task.keys)} sources from {task.keys[0]!r})"
