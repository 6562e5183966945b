"""Running shard tasks: decode sources and write one shard, in this or another process.

A :class:`ShardTask` is everything needed to produce one shard file and is
picklable, so any :class:`concurrent.futures.Executor` can run it (a local
process pool by default, a Dask client's executor for a cluster). With the
default local pool the building process takes tasks too, from the other end
of the queue, so no core idles while the pool's interpreters start.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import (
    FIRST_COMPLETED,
    BrokenExecutor,
    Executor,
    Future,
    ProcessPoolExecutor,
    wait,
)
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

Loader = Callable[[str], Any]


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
    """Everything a worker needs to produce one shard (picklable)."""

    root: str
    rel: str
    keys: list[str]
    loader: Loader
    dtype: str
    item_shape: tuple[int, ...]
    rows_per_shard: int
    write_on_failure: bool


@dataclass(slots=True)
class ShardResult:
    """What a worker reports back for one shard."""

    rel: str
    size: int = 0
    checksum: str = ""
    failures: list[tuple[int, str]] = field(default_factory=list)
    source_size: list[int] = field(default_factory=list)
    source_mtime_ns: list[int] = field(default_factory=list)


def run_shard(task: ShardTask) -> ShardResult:
    """Decode every key of one shard and write the shard file (in a worker)."""
    dtype = np.dtype(task.dtype)
    block = np.zeros((len(task.keys), *task.item_shape), dtype=dtype)
    result = ShardResult(task.rel)
    for i, key in enumerate(task.keys):
        size, mtime = _source_identity(key)
        result.source_size.append(size)
        result.source_mtime_ns.append(mtime)
        try:
            block[i] = load_item(task.loader, key, dtype, task.item_shape)
        except Exception as exc:  # every failure is reported, none stops the build
            result.failures.append((i, f"{type(exc).__name__}: {exc}"))
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

    With no ``executor``, ``nworkers`` processes work: this one and a spawned
    pool of ``nworkers - 1``. A given ``executor`` runs every task itself.
    """
    bar = tqdm(
        total=n, unit="item", desc=f"building {target.name}", disable=not progress, smoothing=0.1
    )
    try:
        if executor is not None:
            return _collect(executor, tasks, bar, pool_size=len(tasks), local=False)
        if nworkers == 1 or len(tasks) <= 1:
            results: dict[str, ShardResult] = {}
            for task in tasks:
                results[task.rel] = run_shard(task)
                bar.update(len(task.keys))
            return results
        try:
            pickle.dumps(tasks[0].loader)
        except Exception as exc:
            raise TypeError(
                f"the loader {tasks[0].loader!r} cannot be sent to worker processes ({exc}); "
                "define it at module level (not a lambda or closure) or pass workers=1"
            ) from None
        ctx = multiprocessing.get_context("spawn")
        size = min(nworkers - 1, len(tasks) - 1)
        with ProcessPoolExecutor(
            max_workers=size, mp_context=ctx, initializer=_exit_with_parent
        ) as pool:
            return _collect(pool, tasks, bar, pool_size=size, local=True)
    finally:
        bar.close()


def _exit_with_parent() -> None:
    """In a pool worker: exit as soon as the building process dies.

    A worker blocks on the task queue, whose write end every worker also
    holds, so it would never see the builder vanish (SIGKILL, out of memory)
    and would linger forever. A daemon thread waits for the parent's death
    instead; whatever the worker was writing lies in the dead build's
    directory, which ``collect_debris`` removes.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="tsc-exit-with-parent", daemon=True).start()


def _collect(
    pool: Executor, tasks: list[ShardTask], bar: Any, *, pool_size: int, local: bool
) -> dict[str, ShardResult]:
    """Feed ``pool`` from the front of the queue; with ``local``, work from its back."""
    pending = deque(tasks)
    inflight: dict[Future[ShardResult], ShardTask] = {}
    results: dict[str, ShardResult] = {}

    def refill() -> None:
        # one queued task per pool process beyond the running ones keeps it busy
        while pending and len(inflight) < 2 * pool_size:
            task = pending.popleft()
            inflight[pool.submit(run_shard, task)] = task

    def harvest(done: set[Future[ShardResult]]) -> None:
        for fut in done:
            task = inflight.pop(fut)
            try:
                results[task.rel] = fut.result()
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
        left = [t.rel for t in tasks if t.rel not in results]
        raise BuildError(
            f"a worker process died abruptly (killed by a signal, out of memory, or a crash "
            f"in native code) with {len(left)} shard(s) unfinished (e.g. {left[:3]}); nothing "
            "was published. Build again; if it keeps failing, build with workers=1 to find "
            "the source that crashes the loader."
        ) from exc
    except BaseException:
        for fut in inflight:
            fut.cancel()
        raise
    return results
