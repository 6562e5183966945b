"""Layer 5, writer: the worker processes of a build's pool (:mod:`~tensorstore_cache.writer.procs`),
real processes each time: tasks and errors, a worker that dies, a worker dismissed while it
starts, tasks taken back, and a worker that imports only what its tasks need."""

from __future__ import annotations

import os
import signal
import sys
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from tensorstore_cache.writer.procs import RemoteTraceback, WorkerDied, Workers

from ..support import _workers

GUARD_S = 120  # a guard against hangs, not a timing assertion


def _pool(size: int, init: object = _workers.note_start, *args: object) -> Workers:
    pool = Workers(size, dict(os.environ))
    pool.start(init, args or ("started",))  # type: ignore[arg-type]
    return pool


def test_tasks_run_in_fresh_worker_processes_after_their_initializer() -> None:
    pool = _pool(2)
    try:
        futures = [pool.submit(_workers.whoami, x) for x in range(20)]
        answers = [f.result(GUARD_S) for f in futures]
    finally:
        pool.shutdown()
    assert [square for _pid, square, _noted in answers] == [x * x for x in range(20)]
    pids = {pid for pid, _square, _noted in answers}
    assert os.getpid() not in pids and pids <= {w.pid for w in pool.workers}
    assert all(noted == ["started"] for _pid, _square, noted in answers)
    for worker in pool.workers:  # told to exit, each exited; one still starting was killed
        allowed = (0,) if worker.pid in pids else (0, -signal.SIGKILL)
        assert worker.process.returncode in allowed, (worker.pid, pids)


def test_an_error_comes_back_with_the_workers_traceback() -> None:
    pool = _pool(1)
    try:
        future = pool.submit(_workers.fails, "bad cover")
        with pytest.raises(ValueError, match="bad cover") as info:
            future.result(GUARD_S)
        assert pool.submit(_workers.whoami, 3).result(GUARD_S)[1] == 9  # the worker goes on
        with pytest.raises(RuntimeError, match="result could not be sent back"):
            pool.submit(_workers.unpicklable).result(GUARD_S)
    finally:
        pool.shutdown()
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert 'in fails\n    raise ValueError(message)' in str(cause), str(cause)


def test_an_answer_that_cannot_be_read_fails_its_task_not_the_pool() -> None:
    pool = _pool(1)
    try:
        with pytest.raises(RuntimeError, match=r"could not be read.*NeedsTwoError"):
            pool.submit(_workers.raises_unloadable).result(GUARD_S)
        assert pool.submit(_workers.whoami, 4).result(GUARD_S)[1] == 16  # the worker goes on
    finally:
        pool.shutdown()


def test_a_worker_that_dies_breaks_the_pool_and_the_others_are_killed() -> None:
    pool = _pool(2)
    try:
        assert pool.submit(_workers.whoami, 1).result(GUARD_S)
        dead = pool.submit(_workers.dies, 3)
        with pytest.raises(WorkerDied, match=r"died \(exit code 3\)"):
            dead.result(GUARD_S)
        with pytest.raises(WorkerDied):
            pool.submit(_workers.whoami, 2)
        assert pool.join(GUARD_S)
    finally:
        pool.kill()
    codes = sorted(w.process.wait() for w in pool.workers)
    assert codes == [-signal.SIGKILL, 3], codes  # the one that died first stands out


def test_a_worker_still_starting_when_nothing_is_left_is_killed_not_waited_for(
    tmp_path: Path,
) -> None:
    never = str(tmp_path / "never")  # its initializer waits for a file nobody makes
    pool = _pool(1, _workers.wait_for, never)
    queued = pool.submit(_workers.whoami, 5)
    assert queued.cancel()  # no task is sent to a worker before it is ready: taken back
    pool.shutdown(wait=True)  # returns: the starting worker is killed, not waited for
    assert pool.workers[0].process.returncode == -signal.SIGKILL
    with pytest.raises(CancelledError):
        queued.result(0)


def test_a_worker_takes_the_building_process_sys_path(tmp_path: Path) -> None:
    module = tmp_path / "only_here" / "private_task.py"
    module.parent.mkdir()
    module.write_text("import os\n\ndef pid():\n    return os.getpid()\n")
    sys.path.insert(0, str(module.parent))
    try:
        import private_task  # type: ignore[import-not-found]

        pool = _pool(1)
        try:
            assert pool.submit(private_task.pid).result(GUARD_S) != os.getpid()
        finally:
            pool.shutdown()
    finally:
        sys.path.remove(str(module.parent))
        sys.modules.pop("private_task", None)


def test_a_worker_imports_the_package_interface_only_when_a_task_uses_it() -> None:
    pool = _pool(1)
    try:
        first = pool.submit(_workers.loaded).result(GUARD_S)
        version, complete = pool.submit(_workers.uses_the_package).result(GUARD_S)
        after = pool.submit(_workers.loaded).result(GUARD_S)
    finally:
        pool.shutdown()
    assert "tensorstore_cache.writer.procs" in first
    for heavy in ("tensorstore_cache._api", "tensorstore_cache.reader", "tensorstore_cache.cache"):
        assert heavy not in first, first  # the package's __init__ has not run
        assert heavy in after, after  # it ran when a task used a name of the package
    import tensorstore_cache

    assert (version, complete) == (tensorstore_cache.__version__, True)


def test_a_task_assigned_to_a_worker_waits_for_it(tmp_path: Path) -> None:
    """Every worker takes part: what is assigned to one is never taken by another, even while
    it starts and the other is free."""
    gates = tmp_path / "gates"
    gates.mkdir()
    pool = Workers(2, dict(os.environ))
    starting, free = pool.workers
    pool.start(_workers.wait_for_own_gate, (str(gates),))
    try:
        (gates / str(free.pid)).touch()
        assigned = pool.assign(0, _workers.whoami, 7)
        others = [pool.submit(_workers.whoami, x) for x in range(10)]
        assert [f.result(GUARD_S)[:2] for f in others] == [(free.pid, x * x) for x in range(10)]
        assert not assigned.done()  # the free worker did all the rest, not this one
        (gates / str(starting.pid)).touch()
        assert assigned.result(GUARD_S)[:2] == (starting.pid, 49)
    finally:
        pool.shutdown()


def test_a_worker_sees_the_building_process_argv() -> None:
    pool = _pool(1)
    try:
        assert pool.submit(_workers.argv).result(GUARD_S) == sys.argv
    finally:
        pool.shutdown()
