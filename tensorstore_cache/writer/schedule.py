"""Running a build's shard tasks: on a given executor, or on the build's own pool.

With no executor, ``workers`` processes work: this one and a
:class:`~.pool.BuildPool` of ``workers - 1``, which receives the loader once
per worker rather than in every task; the building process takes tasks
too, from the other end of the queue (where a batched build's first
batches, computed to learn the shape, are), so no core idles while the
pool's interpreters start. Once that end is empty, it takes back the tasks
sent to the pool that no worker has started yet, except each worker's
first: a worker is never left with two shards to finish while this process
waits, and every worker of the pool takes part in the build.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from pathlib import Path
from typing import Any

from ..errors import BuildError
from .pool import BuildPool
from .tasks import ShardResult, ShardTask, run_shard

__all__ = ["daemonic", "run_tasks"]

logger = logging.getLogger("tensorstore_cache")


class _NoBar:
    """The progress bar of a build that shows none."""

    def update(self, n: int) -> None:
        """Count ``n`` items (nothing to show)."""

    def close(self) -> None:
        """Nothing to close."""


def daemonic() -> bool:
    """Whether this is a daemonic process (a DataLoader or multiprocessing pool worker),
    which cannot start worker processes."""
    return bool(multiprocessing.current_process().daemon)


def run_tasks(
    tasks: list[ShardTask],
    *,
    workers: int,
    progress: bool,
    executor: Executor | None,
    target: Path,
    n: int,
    label: str | None = None,
    pool: BuildPool | None = None,
    local_first: Callable[[], None] | None = None,
) -> dict[str, ShardResult]:
    """Run every task and return the results by shard path.

    With no ``executor``, ``workers`` processes work: this one and a
    :class:`~.pool.BuildPool` of ``workers - 1`` (``pool``, started
    already for the build and closed by whoever started it, or one started
    here). A given ``executor`` runs every task itself. ``progress`` shows
    a bar of the ``n`` items of the build of ``target``, described by
    ``label`` (default ``building <target's name>``). ``local_first`` runs
    here before anything else but the pool's first tasks (at most ``2 *
    pool.size`` from the front of the queue, sent first), or before any task
    without a pool.
    """
    if local_first is not None and (pool is None or executor is not None or workers == 1
                                    or len(tasks) <= 1 or daemonic()):
        local_first()  # nothing is sent to a pool ahead of it
        local_first = None
    bar: Any = _NoBar()
    if progress:  # imported only for a bar: at module level it adds ~0.1 s to every import
        from tqdm.auto import tqdm

        desc = label if label is not None else f"building {target.name}"
        bar = tqdm(total=n, unit="item", desc=desc, smoothing=0.1)
    try:
        if executor is not None:
            given = executor

            def submit(task: ShardTask) -> Future[ShardResult]:
                return given.submit(run_shard, task)

            return _collect(submit, tasks, bar, pool_size=len(tasks), local=False,
                            broken=_broken_executor)
        if workers > 1 and len(tasks) > 1 and daemonic():
            logger.warning(
                "tensorstore_cache: building %s in this process (workers=1): a daemonic process "
                "(a DataLoader or multiprocessing pool worker) cannot start worker processes",
                target.name,
            )
            workers = 1
        if workers == 1 or len(tasks) <= 1:
            results: dict[str, ShardResult] = {}
            for task in tasks:
                results[task.rel] = run_shard(task)
                bar.update(len(task.keys))
            return results
        if pool is not None:  # its owner closes it, or kills it if this fails
            return _collect(pool.submit, tasks, bar, pool_size=pool.size, local=True,
                            broken=pool.explain, first=local_first)
        size = min(workers - 1, len(tasks) - 1)
        loader = tasks[0].loader
        assert loader is not None
        own = BuildPool(size, loader, Path(tasks[0].root))
        try:
            results = _collect(own.submit, tasks, bar, pool_size=size, local=True,
                               broken=own.explain)
        except BaseException:
            own.abort()
            raise
        own.close()
        return results
    finally:
        bar.close()


def _broken_executor(exc: BaseException, left: list[ShardTask]) -> BaseException:
    """The error of a build whose given executor broke (a worker died)."""
    return BuildError(
        f"a worker process died abruptly (killed by a signal, out of memory, or a crash "
        f"in native code) with {len(left)} shard(s) unfinished (e.g. {[t.rel for t in left[:3]]}); "
        "nothing was published. Build again; if it keeps failing, build with workers=1 to "
        "find the source that crashes the loader."
    )


def _steal(inflight: dict[Future[ShardResult], ShardTask],
           committed: set[Future[ShardResult]]) -> ShardTask | None:
    """A task sent to the pool that no worker has started, taken back (cancelled there), but
    none of the ``committed`` (each worker's first): this process runs it rather than wait
    for a worker to finish two."""
    for future in list(inflight):
        if future not in committed and future.cancel():
            return inflight.pop(future)
    return None


def _collect(
    submit: Callable[[ShardTask], Future[ShardResult]],
    tasks: list[ShardTask],
    bar: Any,
    *,
    pool_size: int,
    local: bool,
    broken: Callable[[BaseException, list[ShardTask]], BaseException],
    first: Callable[[], None] | None = None,
) -> dict[str, ShardResult]:
    """Feed the pool from the front of the queue; with ``local``, work from its back, then
    take back what the pool has not started (but each worker's first task).

    ``first`` runs once the pool has its first tasks, before anything else
    here. ``submit`` hands a task to the pool; ``broken`` turns the
    :class:`~concurrent.futures.BrokenExecutor` of a pool that broke (a
    worker died, or could not start) into the error to raise, given the
    unfinished tasks.
    """
    pending = deque(tasks)
    inflight: dict[Future[ShardResult], ShardTask] = {}
    results: dict[str, ShardResult] = {}

    def refill() -> None:
        # one queued task per pool process beyond the running ones keeps it busy
        while pending and len(inflight) < 2 * pool_size:
            task = pending.popleft()
            inflight[submit(task)] = task

    def harvest(done: set[Future[ShardResult]]) -> None:
        for fut in done:
            task = inflight.pop(fut)
            try:
                results[task.rel] = fut.result()
            except BrokenExecutor:  # the pool broke: no shard's own error
                raise
            except Exception as exc:
                first = task.keys[0] if task.keys else "-"
                exc.add_note(
                    f"while building shard {task.rel} ({len(task.keys)} sources from {first!r})"
                )
                raise
            bar.update(len(task.keys))

    try:
        refill()
        committed = set(list(inflight)[:pool_size])  # every worker takes part
        if first is not None:
            first()
        while pending or inflight:
            task = (pending.pop() if local and pending else
                    _steal(inflight, committed) if local else None)
            if task is not None:
                results[task.rel] = run_shard(task)
                bar.update(len(task.keys))
                harvest({f for f in inflight if f.done()})
            else:
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                harvest(done)
            refill()
    except BrokenExecutor as exc:
        for fut in inflight:
            fut.cancel()
        raise broken(exc, [t for t in tasks if t.rel not in results]) from exc
    except BaseException:
        for fut in inflight:
            fut.cancel()
        raise
    return results
