"""Running a build's shard tasks: on a given executor, or on the build's own pool.

With no executor, ``workers`` processes work: this one and a
:class:`~.pool.BuildPool` of ``workers - 1``, which receives the loader once
per worker rather than in every task; the building process takes tasks
too, from the other end of the queue (where a batched build's first
batches, computed to learn the shape, are), so no core idles while the
pool's interpreters start. Once that end is empty, it takes back the tasks
sent to the pool that no worker has started yet, except each worker's
first: a worker is never left with two shards to finish while this process
waits, and every worker of the pool takes part in the build. Near the end,
the shards left are cut into pieces of a few rows (:mod:`.pieces`), which
the pool and this process both take, so that they end a piece apart, not a
shard apart (a batched build's shards stay whole: their rows are computed
in batches).
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from pathlib import Path
from typing import Any

from ..errors import BuildError
from .pieces import Piece, Tail, run_unit
from .pool import BuildPool
from .tasks import BatchStage, ShardResult, ShardTask, run_shard

__all__ = ["daemonic", "run_tasks"]

logger = logging.getLogger("tensorstore_cache")

#: What the pool runs: a shard task, or a piece of one.
_Unit = ShardTask | Piece


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
    if executor is None and workers > 1 and len(tasks) > 1 and daemonic():
        logger.warning(
            "tensorstore_cache: building %s in this process (workers=1): a daemonic process "
            "(a DataLoader or multiprocessing pool worker) cannot start worker processes",
            target.name,
        )
        workers = 1
    # a pool of its own before the bar, whose monitor thread would keep its workers unforked
    own = (_own_pool(tasks, workers)
           if executor is None and pool is None and workers > 1 and len(tasks) > 1 else None)
    try:
        bar = _progress_bar(progress, n, target, label)
    except BaseException:
        if own is not None:
            own.abort()
        raise
    try:
        if executor is not None:
            given = executor

            def submit(task: _Unit) -> Future[ShardResult]:
                assert isinstance(task, ShardTask)  # nothing is cut without local work
                return given.submit(run_shard, task)

            return _collect(submit, tasks, bar, pool_size=len(tasks), local=False,
                            broken=_broken_executor)
        if workers == 1 or len(tasks) <= 1:
            results: dict[str, ShardResult] = {}
            for task in tasks:
                results[task.rel] = run_shard(task)
                bar.update(len(task.keys))
            return results
        if pool is not None:  # its owner closes it, or kills it if this fails
            return _collect(pool.submit, tasks, bar, pool_size=pool.size, local=True,
                            broken=pool.explain, first=local_first)
        assert own is not None
        try:
            results = _collect(own.submit, tasks, bar, pool_size=own.size, local=True,
                               broken=own.explain, cut=not isinstance(tasks[0].loader, BatchStage))
            own.close()  # a Ctrl-C while it waits for the workers to exit kills them
        except BaseException:
            own.abort()
            raise
        return results
    finally:
        bar.close()


def _own_pool(tasks: list[ShardTask], workers: int) -> BuildPool:
    """The pool a build of ``tasks`` by ``workers`` processes starts for itself."""
    loader = tasks[0].loader
    assert loader is not None
    return BuildPool(min(workers - 1, len(tasks) - 1), loader, Path(tasks[0].root))


def _progress_bar(progress: bool, n: int, target: Path, label: str | None) -> Any:
    """The bar of a build of ``n`` items (none unless ``progress``)."""
    if not progress:
        return _NoBar()
    # imported only for a bar: at module level it adds ~0.1 s to every import
    from tqdm.auto import tqdm

    desc = label if label is not None else f"building {target.name}"
    return tqdm(total=n, unit="item", desc=desc, smoothing=0.1)


def _broken_executor(exc: BaseException, left: list[ShardTask]) -> BaseException:
    """The error of a build whose given executor broke (a worker died)."""
    return BuildError(
        f"a worker process died abruptly (killed by a signal, out of memory, or a crash "
        f"in native code) with {len(left)} shard(s) unfinished (e.g. {[t.rel for t in left[:3]]}); "
        "nothing was published. Build again; if it keeps failing, build with workers=1 to "
        "find the source that crashes the loader."
    )


def _taken_back(inflight: dict[Future[Any], _Unit],
                committed: set[Future[Any]]) -> Iterator[_Unit]:
    """The units sent to the pool that no worker has started, in the order they were sent,
    each taken back (cancelled there) as it is reached, but the ``committed`` (each worker's
    first): this process runs them rather than wait for a worker to finish two."""
    for future, unit in list(inflight.items()):
        if future not in committed and future.cancel():
            del inflight[future]
            yield unit


class _Units:
    """A build's units of work: those left to send, those the pool has (by future), the
    results by shard path, and the shards cut into pieces; ``submit`` sends one to the pool
    and ``bar`` counts what is done."""

    def __init__(self, tasks: list[ShardTask], submit: Callable[[_Unit], Future[Any]],
                 bar: Any, pool_size: int) -> None:
        self.pending: deque[_Unit] = deque(tasks)
        self.inflight: dict[Future[Any], _Unit] = {}
        self.results: dict[str, ShardResult] = {}
        self.tail = Tail()
        self._submit, self._bar, self._pool_size = submit, bar, pool_size

    def refill(self) -> None:
        """Send from the front: one queued unit per pool process beyond the running ones
        keeps it busy."""
        while self.pending and len(self.inflight) < 2 * self._pool_size:
            unit = self.pending.popleft()
            self.inflight[self._submit(unit)] = unit

    def cut(self, committed: set[Future[Any]]) -> None:
        """Cut the shards left, and those the pool has not started (but the ``committed``),
        into pieces, and send the pool its share."""
        # nothing is cut yet: every unit sent or left is a whole shard
        shards = [u for u in (*_taken_back(self.inflight, committed), *self.pending)
                  if isinstance(u, ShardTask)]
        self.pending.clear()
        self.pending.extend(self.tail.cut(shards))
        self.refill()

    def settle(self, unit: _Unit, value: Any) -> None:
        """Note what ``unit`` gave: a shard's result, or a piece's rows (the last piece of a
        shard has its shard written here)."""
        if isinstance(unit, Piece):
            self._bar.update(len(unit.task.keys))
            whole = self.tail.add(unit, value)
            if whole is not None:  # its last piece: all its rows are computed
                self.results[whole.rel] = run_shard(whole)
            return
        self._bar.update(len(unit.keys))
        self.results[unit.rel] = value

    def harvest(self, done: set[Future[Any]]) -> None:
        """Settle the units of the ``done`` futures (a unit's error names its shard)."""
        for fut in done:
            unit = self.inflight.pop(fut)
            try:
                value = fut.result()
            except BrokenExecutor:  # the pool broke: no shard's own error
                raise
            except Exception as exc:
                task = _shard_of(unit)
                first = task.keys[0] if task.keys else "-"
                exc.add_note(
                    f"while building shard {task.rel} ({len(task.keys)} sources from {first!r})"
                )
                raise
            self.settle(unit, value)


def _shard_of(unit: _Unit) -> ShardTask:
    return unit.task if isinstance(unit, Piece) else unit


def _collect(
    submit: Callable[[_Unit], Future[Any]],
    tasks: list[ShardTask],
    bar: Any,
    *,
    pool_size: int,
    local: bool,
    broken: Callable[[BaseException, list[ShardTask]], BaseException],
    first: Callable[[], None] | None = None,
    cut: bool = False,
) -> dict[str, ShardResult]:
    """Feed the pool from the front of the queue; with ``local``, work from its back, then
    take back what the pool has not started (but each worker's first task).

    ``first`` runs once the pool has its first tasks, before anything else
    here. With ``cut`` (and ``local``), once at most ``pool_size + 1``
    tasks are left unsent, those and the ones the pool has not started are
    cut into pieces (:mod:`.pieces`), whose shards this process writes.
    ``submit`` hands a task or a piece to the pool; ``broken`` turns the
    :class:`~concurrent.futures.BrokenExecutor` of a pool that broke (a
    worker died, or could not start) into the error to raise, given the
    unfinished tasks.
    """
    units = _Units(tasks, submit, bar, pool_size)
    pending, inflight = units.pending, units.inflight
    cut_at = pool_size + 1 if cut and local else -1
    try:
        units.refill()
        committed = set(list(inflight)[:pool_size])  # every worker takes part
        if first is not None:
            first()
        while pending or inflight:
            if len(pending) <= cut_at:  # the last shards: the processes end a piece apart
                cut_at = -1
                units.cut(committed)
            unit = (pending.pop() if local and pending else
                    next(_taken_back(inflight, committed), None) if local else None)
            if unit is not None:
                units.settle(unit, run_unit(unit))
                units.harvest({f for f in inflight if f.done()})
            else:
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                units.harvest(done)
            units.refill()
    except BrokenExecutor as exc:
        for fut in inflight:
            fut.cancel()
        raise broken(exc, [t for t in tasks if t.rel not in units.results]) from exc
    except BaseException:
        for fut in inflight:
            fut.cancel()
        raise
    return units.results
