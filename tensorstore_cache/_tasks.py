"""Running shard tasks: decode sources and write one shard, in this or another process.

A :class:`ShardTask` is everything needed to produce one shard file and is
picklable, so any :class:`concurrent.futures.Executor` can run it (a Dask
client's executor for a cluster). By default a build runs its tasks on its
own :class:`~._pool.BuildPool`, which receives the loader once per worker
rather than in every task, and the building process takes tasks too, from
the other end of the queue, so no core idles while the pool's interpreters
start.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm.auto import tqdm

from ._errors import BuildError
from ._format import VECTORS
from ._jsonio import fsync_dir, io_step
from ._shard import write_shard

__all__ = ["Loader", "ShardResult", "ShardTask", "load_item", "run_shard", "run_tasks"]

logger = logging.getLogger("tensorstore_cache")

Loader = Callable[[str], Any]

#: How many of the loader's own frames a failure reports.
TRACE_FRAMES = 3


def load_item(loader: Loader, key: str, dtype: np.dtype[Any], shape: tuple[int, ...] | None) -> npt.NDArray[Any]:
    """Call ``loader`` on ``key`` and check the result's shape and dtype."""
    value = np.asarray(loader(key))
    if shape is not None and value.shape != shape:
        raise ValueError(
            f"the loader returned shape {value.shape}, but every item must have shape {shape}"
        )
    if value.dtype != dtype:
        if not np.can_cast(value.dtype, dtype, "same_kind"):
            raise TypeError(
                f"the loader returned {value.dtype}, which cannot be stored as {dtype} "
                f"without changing its kind; return {dtype} or pass dtype={value.dtype.name!r}"
            )
        value = value.astype(dtype)
    return value


def _source_identity(key: str) -> tuple[int, int]:
    try:
        st = os.stat(key)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


@dataclass(slots=True)
class ShardTask:
    """Everything a worker needs to produce one shard (picklable).

    ``loader`` is None in the tasks sent to a :class:`~._pool.BuildPool`,
    whose workers received the loader when they started. ``computed`` holds
    items computed already, by row in the shard (the one that told the
    builder the item shape).
    """

    root: str
    rel: str
    keys: list[str]
    loader: Loader | None
    dtype: str
    item_shape: tuple[int, ...]
    rows_per_shard: int
    write_on_failure: bool
    computed: dict[int, npt.NDArray[Any]] = field(default_factory=dict)


@dataclass(slots=True)
class ShardResult:
    """What a worker reports back for one shard.

    ``failures`` holds ``(row in the shard, "Type: message", the loader's
    last frames)`` of every source the loader failed on.
    """

    rel: str
    size: int = 0
    checksum: str = ""
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    source_size: list[int] = field(default_factory=list)
    source_mtime_ns: list[int] = field(default_factory=list)


def _loader_frames(exc: BaseException) -> str:
    """The last frames of ``exc``'s traceback that are not this module's, formatted."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    return "".join(traceback.format_list(frames[-TRACE_FRAMES:])).rstrip()


def run_shard(task: ShardTask, loader: Loader | None = None) -> ShardResult:
    """Decode every key of one shard and write the shard file (in a worker).

    ``loader`` is used instead of ``task.loader`` when given.
    """
    fn = loader if loader is not None else task.loader
    if fn is None:
        raise ValueError(f"shard task {task.rel} has no loader")
    dtype = np.dtype(task.dtype)
    block = np.zeros((len(task.keys), *task.item_shape), dtype=dtype)
    result = ShardResult(task.rel)
    for i, key in enumerate(task.keys):
        size, mtime = _source_identity(key)
        result.source_size.append(size)
        result.source_mtime_ns.append(mtime)
        try:
            done = task.computed.get(i)
            block[i] = load_item(fn, key, dtype, task.item_shape) if done is None else done
        except Exception as exc:  # every failure is reported, none stops the build
            result.failures.append((i, f"{type(exc).__name__}: {exc}", _loader_frames(exc)))
    if result.failures and not task.write_on_failure:
        return result
    path = Path(task.root) / task.rel
    # Create the shard's directories below the build's vectors/ only: if the build
    # was abandoned (its directory removed or published), a late or retried task
    # fails here instead of recreating it. write_shard replaces atomically, so a
    # retried task overwrites whatever a killed attempt left.
    base = Path(task.root) / VECTORS
    d = base
    for part in Path(task.rel).parts[1:-1]:  # "c", shard number, "0"...
        d = d / part
        io_step("mkdir")
        d.mkdir(exist_ok=True)
    result.size, result.checksum = write_shard(path, block, task.rows_per_shard, parents=False)
    d = path.parent
    while d != base.parent:
        fsync_dir(d)
        d = d.parent
    return result


def run_tasks(
    tasks: list[ShardTask],
    nworkers: int,
    progress: bool,
    executor: Executor | None,
    target: Path,
    n: int,
) -> dict[str, ShardResult]:
    """Run every task and return the results by shard path.

    With no ``executor``, ``nworkers`` processes work: this one and a
    :class:`~._pool.BuildPool` of ``nworkers - 1``. A given ``executor``
    runs every task itself.
    """
    bar = tqdm(
        total=n, unit="item", desc=f"building {target.name}", disable=not progress, smoothing=0.1
    )
    try:
        if executor is not None:
            given = executor

            def submit(task: ShardTask) -> Future[ShardResult]:
                return given.submit(run_shard, task)

            return _collect(submit, tasks, bar, pool_size=len(tasks), local=False,
                            broken=_broken_executor)
        if nworkers > 1 and len(tasks) > 1 and multiprocessing.current_process().daemon:
            logger.warning(
                "tensorstore_cache: building %s in this process (workers=1): a daemonic process "
                "(a DataLoader or multiprocessing pool worker) cannot start worker processes",
                target.name,
            )
            nworkers = 1
        if nworkers == 1 or len(tasks) <= 1:
            results: dict[str, ShardResult] = {}
            for task in tasks:
                results[task.rel] = run_shard(task)
                bar.update(len(task.keys))
            return results
        from ._pool import BuildPool

        size = min(nworkers - 1, len(tasks) - 1)
        loader = tasks[0].loader
        assert loader is not None
        pool = BuildPool(size, loader, Path(tasks[0].root))
        try:
            results = _collect(pool.submit, tasks, bar, pool_size=size, local=True,
                               broken=pool.explain)
        except BaseException:
            pool.abort()
            raise
        pool.close()
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


def _collect(
    submit: Callable[[ShardTask], Future[ShardResult]],
    tasks: list[ShardTask],
    bar: Any,
    *,
    pool_size: int,
    local: bool,
    broken: Callable[[BaseException, list[ShardTask]], BaseException],
) -> dict[str, ShardResult]:
    """Feed the pool from the front of the queue; with ``local``, work from its back.

    ``submit`` hands a task to the pool; ``broken`` turns the
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
        while pending or inflight:
            if local and pending:
                task = pending.pop()
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
