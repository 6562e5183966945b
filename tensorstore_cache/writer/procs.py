"""Worker processes, each fed its tasks through pipes of its own.

:class:`Workers` is the executor of a build's pool. Each worker is forked from
the building process where its pool says it may (:mod:`.forked`), else it is a
new ``python`` (``fork`` immediately followed by ``exec``, as :mod:`subprocess`
starts it: the building process, which may run threads, is not forked) that
takes the building process's ``sys.path`` before it imports anything. Either
way its ``__main__`` never runs again, it ignores SIGINT from its first
statement, runs the pool's initializer once, says it is ready, and then runs
the tasks it is sent, one at a time. In the building process one thread per
worker sends it its start, then a task each time it is free (one assigned to
it first, then any), and settles the task's future with the answer; nothing
else runs there (no manager thread, no helper process). A task is sent only
to a worker that is ready: until then it waits in a queue, where this
process can take it back (:meth:`concurrent.futures.Future.cancel`).

A worker that dies (a signal, ``os._exit``, out of memory) breaks the
executor: the thread that waited for it sees its pipe close, its task and
every queued one fail with :class:`WorkerDied`, and the other workers are
killed (``SIGKILL``), so that an exit code other than ``-SIGKILL`` singles
out the worker that died first. A worker exits when told to, then without the
interpreter's final teardown (:mod:`.quick_exit`: its tasks wrote and closed
what they wrote; a forked one by :func:`os._exit`), or as soon as its pipe
from the building process closes (that process died). A worker still starting when nothing is left for it to
do is killed instead of waited for (:meth:`Workers.shutdown`).

Messages are pickles preceded by their length (8 bytes, little-endian).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import BrokenExecutor, Executor, Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

    from .forked import Forked

__all__ = ["RemoteTraceback", "WorkerDied", "Workers"]

#: What a new worker's interpreter runs: SIGINT ignored first; the building process's
#: ``sys.path`` and ``sys.argv`` taken (nothing imported but builtins before); the package
#: made importable without running its ``__init__``, which imports the whole interface (the
#: reader, the caches, the remote layer...): it runs when the loader first uses a name of the
#: package, so that a worker imports only what its tasks need; then this module's loop.
BOOT = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
def read(n, fd=int(sys.argv[1])):
    data = b""
    while len(data) < n:
        part = os.read(fd, n - len(data))
        if not part:
            os._exit(0)
        data += part
    return data
import marshal
sys.path[:], argv = marshal.loads(read(int.from_bytes(read(8), "little")))
import importlib.util
spec = importlib.util.find_spec("tensorstore_cache")
package = importlib.util.module_from_spec(spec)
def interface(name, package=package, spec=spec):
    del package.__getattr__
    spec.loader.exec_module(package)
    return getattr(package, name)
package.__getattr__ = interface
sys.modules["tensorstore_cache"] = package
del spec, package, interface
from tensorstore_cache.writer.procs import serve_tasks
fds, sys.argv[:] = sys.argv[1:], argv
serve_tasks(int(fds[0]), int(fds[1]))
"""
_HEADER = 8
#: The message that tells a worker to exit, and the one a worker sends once it is ready.
_EXIT = _READY = b""
#: Seconds a worker whose pipe closed is given to exit before it is killed.
_EXIT_WAIT_S = 5.0
#: The system calls of the pipes, taken once: a loader that replaces ``os.write`` (to test
#: a full disk, say) does not change how its worker answers.
_write, _read = os.write, os.read


class WorkerDied(BrokenExecutor):
    """A worker process died (its task and every queued one fail with this)."""


class RemoteTraceback(Exception):  # noqa: N818 - not an error: the cause of one
    """The traceback, in the worker, of an error a task raised there (its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.text}\"\"\""


def _send(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(_HEADER, "little") + data)
    while view:
        view = view[_write(fd, view):]


def _recv(fd: int) -> bytes:
    """The next message on ``fd``; :class:`EOFError` once the other end closed it."""
    def exactly(n: int) -> bytes:
        parts, left = [], n
        while left:
            part = _read(fd, min(left, 1 << 20))
            if not part:
                raise EOFError("the pipe was closed")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    return exactly(int.from_bytes(exactly(_HEADER), "little"))


# -- in a worker ---------------------------------------------------------------------


def serve_tasks(rx: int, tx: int) -> None:
    """A worker's life: its initializer, then its tasks until it is told to exit (then
    quickly: :mod:`.quick_exit`) or its pipe closes (then at once)."""
    import atexit

    from .quick_exit import exit_quickly, served

    atexit.register(exit_quickly)  # first: the loader's handlers run before it
    try:
        init, args = pickle.loads(_recv(rx))
        init(*args)
        _send(tx, _READY)
        while (message := _recv(rx)) != _EXIT:
            try:
                fn, fn_args = pickle.loads(message)
                answer: tuple[str, Any, str] = ("ok", fn(*fn_args), "")
            except BaseException as exc:  # every error goes back to the builder
                answer = ("error", exc, _formatted(exc))
            try:
                data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # an unpicklable result or error: said in words
                data = pickle.dumps(("error", _unpicklable(answer, exc), answer[2]))
            _send(tx, data)
    except (EOFError, BrokenPipeError):
        os._exit(0)  # the building process is gone, or gave up on this worker
    served()
    sys.exit(0)


def _formatted(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


def _unpicklable(answer: tuple[str, Any, str], exc: Exception) -> BaseException:
    kind, value, where = answer
    return RuntimeError(f"a worker's {'error' if kind == 'error' else 'result'} could not be "
                        f"sent back ({type(exc).__name__}: {exc}):\n{where or repr(value)}")


# -- in the building process ---------------------------------------------------------


def _spawned(task_r: int, answer_w: int, tx: int, env: Mapping[str, str],
             started: Callable[[subprocess.Popen[bytes]], None]) -> None:
    """Start a worker as a fresh interpreter (given to ``started`` at once), and send it its
    ``sys.path`` and ``sys.argv``."""
    import marshal
    import subprocess

    # the interpreter's options (-X, -W, -O...), as multiprocessing passes them on
    flags: list[str] = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    started(subprocess.Popen(
        [sys.executable, *flags, "-c", BOOT, str(task_r), str(answer_w)],
        pass_fds=(task_r, answer_w), env=dict(env), stdin=subprocess.DEVNULL,
    ))
    # its sys.path at once: it imports this module while the builder goes on
    _send(tx, marshal.dumps(([p or os.getcwd() for p in sys.path], sys.argv)))


def _answer(data: bytes) -> tuple[str, Any, str]:
    """A worker's answer; one that cannot be unpickled here (an error whose class needs other
    arguments, or cannot be imported) becomes an error that says so."""
    try:
        answer: tuple[str, Any, str] = pickle.loads(data)
    except Exception as exc:  # a future left unsettled would hang the build
        return ("error", RuntimeError(
            "a worker's answer could not be read in the building process "
            f"({type(exc).__name__}: {exc})"), "")
    return answer


class _Worker:
    """One worker process, its pipes and the thread that feeds it."""

    def __init__(self, owner: Workers, env: Mapping[str, str], fork: list[int] | None) -> None:
        task_r, self.tx = os.pipe()
        self.rx, answer_w = os.pipe()
        started: list[Forked | subprocess.Popen[bytes]] = []  # its process, once there is one
        try:
            if fork is not None:  # this process's ends of the other workers' pipes, and its own
                from .forked import fork_worker

                with contextlib.suppress(OSError):  # refused (memory, process limits): fresh
                    fork_worker(task_r, answer_w, [*fork, self.tx, self.rx], env, serve_tasks,
                                started.append)
            if not started:
                _spawned(task_r, answer_w, self.tx, env, started.append)
        except BaseException:  # a Ctrl-C, say: nothing of this worker is left behind
            for process in started:
                process.kill()
                process.wait()
            self.close()
            raise
        finally:
            os.close(task_r)
            os.close(answer_w)
        self.process = started[0]
        self.owner = owner
        #: it ran its initializer and takes tasks; the builder dismissed it while it started
        self.ready = self.dismissed = False
        #: the tasks assigned to it (:meth:`Workers.assign`), taken before any other
        self.own: deque[tuple[Future[Any], bytes]] = deque()
        self.thread = threading.Thread(target=self._feed, name=f"tsc-worker-{self.pid}",
                                       daemon=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _feed(self) -> None:
        """Send the worker its start, then each task it can take; settle each future."""
        owner = self.owner
        future: Future[Any] | None = None
        try:
            _send(self.tx, owner.start_message)
            _recv(self.rx)  # ready: no task waits inside a worker that is still starting
            owner.became_ready(self)
            while (item := owner.next_task(self)) is not None:
                future, message = item
                _send(self.tx, message)
                kind, value, where = _answer(_recv(self.rx))
                if kind == "ok":
                    future.set_result(value)
                else:
                    value.__cause__ = RemoteTraceback(where)
                    future.set_exception(value)
                future = None
            _send(self.tx, _EXIT)
        except (OSError, EOFError):
            owner.died(self, future)
        finally:
            self.close()

    def close(self) -> None:
        """Close this end of the worker's pipes (once)."""
        for fd in (self.tx, self.rx):
            if fd >= 0:
                os.close(fd)
        self.tx = self.rx = -1


class Workers(Executor):
    """``size`` worker processes, started at once; :meth:`start` gives them their
    initializer, then they take the tasks :meth:`submit` queues.

    Parameters
    ----------
    size
        Number of worker processes.
    env
        The workers' environment (all of it).
    fork
        Fork the workers from this process (:mod:`.forked`: the caller checked that it
        may) instead of starting fresh interpreters.
    """

    def __init__(self, size: int, env: Mapping[str, str], *, fork: bool = False) -> None:
        self.start_message = b""
        self._lock = threading.Condition()
        self._queue: deque[tuple[Future[Any], bytes]] = deque()
        self._closing = False
        self._broken: str | None = None
        self.workers: list[_Worker] = []
        try:
            for _ in range(size):
                ends = [fd for w in self.workers for fd in (w.tx, w.rx)] if fork else None
                self.workers.append(_Worker(self, env, ends))
        except BaseException:
            self.kill()
            raise

    def start(self, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
        """Have every worker run ``initializer(*initargs)`` (pickled by reference), then take
        tasks."""
        self.start_message = pickle.dumps((initializer, initargs),
                                          protocol=pickle.HIGHEST_PROTOCOL)
        for worker in self.workers:
            worker.thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args)`` for the first free worker (pickled now; no keyword arguments).

        Raises
        ------
        WorkerDied
            If a worker died (the executor is broken).
        RuntimeError
            After :meth:`shutdown`.
        """
        if kwargs:
            raise TypeError("Workers.submit takes no keyword arguments")
        return self._queued(self._queue, fn, args)

    def assign(self, index: int, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` for worker ``index`` only, which takes it before any other task.

        Raises
        ------
        WorkerDied
            If a worker died (the executor is broken).
        RuntimeError
            After :meth:`shutdown`.
        """
        return self._queued(self.workers[index].own, fn, args)

    def _queued(self, queue: deque[tuple[Future[Any], bytes]], fn: Callable[..., Any],
                args: tuple[Any, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        message = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._broken is not None:
                raise WorkerDied(self._broken)
            if self._closing:
                raise RuntimeError("cannot submit a task after shutdown")
            queue.append((future, message))
            self._lock.notify_all()
        return future

    def _queues(self) -> list[deque[tuple[Future[Any], bytes]]]:
        return [self._queue, *(w.own for w in self.workers)]

    def became_ready(self, worker: _Worker) -> None:
        """In a feeding thread: ``worker`` takes tasks from now on."""
        with self._lock:
            worker.ready = True

    def next_task(self, worker: _Worker) -> tuple[Future[Any], bytes] | None:
        """In ``worker``'s feeding thread: its next task to send (now running; one assigned to
        it first), or None: time to exit."""
        with self._lock:
            while True:
                for queue in (worker.own, self._queue):
                    while queue and self._broken is None:
                        future, message = queue.popleft()
                        if future.set_running_or_notify_cancel():
                            return future, message
                if self._closing or self._broken is not None:
                    return None
                self._lock.wait()

    def died(self, worker: _Worker, future: Future[Any] | None) -> None:
        """In a feeding thread: ``worker``'s pipe closed; break the executor (unless it was
        dismissed)."""
        import subprocess

        try:
            code = worker.process.wait(_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:  # it closed its pipe yet lives on
            worker.process.kill()
            code = worker.process.wait()
        error = f"a worker process (pid {worker.pid}) died (exit code {code})"
        with self._lock:
            if worker.dismissed and future is None:
                return
            if self._broken is None:
                self._broken = error
                # killed before their threads can see the executor broken and tell them to
                # exit: every worker but the first to die ends by SIGKILL
                for other in self.workers:
                    if other is not worker and other.process.poll() is None:
                        other.process.kill()
            queued = [item for queue in self._queues() for item in queue]
            for queue in self._queues():
                queue.clear()
            self._lock.notify_all()
        if future is not None and not future.done():
            future.set_exception(WorkerDied(error))
        for queued_future, _message in queued:
            if queued_future.set_running_or_notify_cancel():
                queued_future.set_exception(WorkerDied(error))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let each worker exit once the queue is empty (``cancel_futures``: the queued
        tasks cancelled); ``wait`` for them to exit. A worker still starting when nothing is
        left to do is killed instead (a build done before its workers were ready does not
        wait for them)."""
        with self._lock:
            self._closing = True
            for queue in self._queues():
                live = [(f, m) for f, m in queue if not f.cancelled()]
                queue.clear()
                for future, message in live:
                    if cancel_futures:
                        future.cancel()
                    else:
                        queue.append((future, message))
            left = any(self._queues())
            idle = [] if left else [w for w in self.workers if not w.ready]
            for worker in idle:
                worker.dismissed = True
            self._lock.notify_all()
        for worker in idle:
            if worker.process.poll() is None:
                worker.process.kill()
        if wait:
            self.join()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every worker to exit (at most ``timeout`` seconds); whether they did."""
        import subprocess
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self.workers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                worker.process.wait(left)
            except subprocess.TimeoutExpired:
                return False
            if worker.thread.ident is not None:
                worker.thread.join(left)
        return True

    def kill(self) -> None:
        """Kill every worker now (``SIGKILL``), cancel what is queued, and reap them."""
        with self._lock:
            if self._broken is None:
                self._broken = "the workers were killed"
            self._closing = True
            for worker in self.workers:  # before their threads can tell them to exit
                if worker.process.poll() is None:
                    worker.process.kill()
            queued = [item for queue in self._queues() for item in queue]
            for queue in self._queues():
                queue.clear()
            self._lock.notify_all()
        for future, _message in queued:
            future.cancel()
        for worker in self.workers:
            worker.process.wait()
            if worker.thread.ident is None:  # never started: its pipes are still open
                worker.close()
            elif worker.thread is not threading.current_thread():
                worker.thread.join()
