"""Building a store: decode in worker processes, write shards, publish atomically.

The coordinator plans the rows into shards, hands whole shards to workers
(never two writers in one shard), then writes the index and the metadata and
publishes the finished directory with a single ``rename``. Everything before
the rename happens in a hidden sibling directory, so a failed or killed build
leaves nothing at the target.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import textwrap
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import config
from ..config import OnError
from ..errors import BuildError, StoreExistsError
from ..format.metadata import VECTORS, GroupMetadata, shard_key
from ..format.spec import StoreSpec
from ..fs.durable import fsync_dir, io_step, remove_partials
from ..fs.temp import collect_temp_siblings, remove_tree, temp_sibling
from ..loaders import Loader, LoaderInfo
from .assemble import finish_store, publish, rewrite_rows
from .reentry import building
from .schedule import run_tasks
from .tasks import ShardTask, load_item

__all__ = [
    "BuildOptions",
    "build",
    "build_dir_target",
    "collect_debris",
    "default_workers",
    "rows_per_shard",
    "temp_dir",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """How to build: the options of one ``build_store`` (or of a cache's build)."""

    loader: LoaderInfo
    """What computes the vectors, and its identity."""
    dtype: str = "float32"
    """Element type stored."""
    workers: int | None = None
    """Worker processes (None: every core)."""
    on_error: OnError = "raise"
    """``"raise"``: publish nothing if a source fails; ``"skip"``: build the rest."""
    progress: bool = True
    """Show a progress bar."""
    overwrite: bool = False
    """Replace an existing store at the target."""
    executor: Executor | None = None
    """Runs the shard tasks instead of a local process pool."""


def default_workers() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def rows_per_shard(n: int, item_nbytes: int, workers: int) -> int:
    """Return the shard length of a store of ``n`` items built by ``workers`` processes."""
    cap = max(1, config.SHARD_BYTES // max(item_nbytes, 1))
    # ~8 shards per worker so that work balances at the end and progress moves, but no
    # tiny shards
    return max(1, min(cap, max(math.ceil(n / (8 * workers)), min(n, 64))))


def temp_dir(target: Path) -> Path:
    """Return a fresh hidden build directory next to ``target`` (not created)."""
    return temp_sibling(target, config.BUILD_MARK)


def collect_debris(out: Path, max_age_s: float = 24 * 3600.0) -> None:
    """Remove temporary build directories of ``out`` left by dead builders."""
    collect_temp_siblings(out.parent, f".{out.name}{config.BUILD_MARK}", max_age_s)


def build_dir_target(name: str) -> str | None:
    """Return the name of the target that the build directory ``name`` belongs to.

    ``None`` if ``name`` is not a build directory (see :func:`temp_dir`).
    """
    if not name.startswith(".") or config.BUILD_MARK not in name:
        return None
    return name[1 : name.index(config.BUILD_MARK)]


def _probe(
    loader: Loader, keys: list[str], dtype: np.dtype[Any]
) -> tuple[int, npt.NDArray[Any]] | None:
    """Return the first key the loader succeeds on, as ``(index, value)``, or None.

    The value is kept and stored as it is: probing computes no item twice.
    """
    for i, key in enumerate(keys):
        try:
            return i, load_item(loader, key, dtype, None)
        except Exception:
            continue
    return None


def build(keys: list[str], target: Path, options: BuildOptions) -> None:
    """Build the store of ``keys`` at ``target`` and publish it atomically.

    Parameters
    ----------
    keys
        Distinct normalised keys, in row order.
    target
        The store directory to create (replaced with ``options.overwrite``).
    options
        How to build.

    Raises
    ------
    BuildError
        If sources failed and ``options.on_error == "raise"``.
    StoreExistsError
        If ``target`` exists and ``options.overwrite`` is false.
    """
    with building(target):  # a loader or worker asking for this build fails at once
        if (target.exists() or target.is_symlink()) and not options.overwrite:
            raise StoreExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or open it "
                "with tensorstore_cache.open_store"
            )
        np_dtype = np.dtype(options.dtype)
        info = options.loader
        n = len(keys)
        nworkers = default_workers() if options.workers is None else int(options.workers)
        if nworkers < 1:
            raise ValueError(f"workers must be at least 1, got {options.workers!r}")
        item_shape = info.item_shape
        probed = None
        if item_shape is None:
            if not keys:
                raise ValueError(
                    "no paths to build and the loader does not declare its item_shape; pass at "
                    "least one path or give the loader an item_shape attribute"
                )
            probed = _probe(info.fn, keys, np_dtype)
            item_shape = probed[1].shape if probed is not None else (0,)
        item_nbytes = int(np.prod(item_shape)) * np_dtype.itemsize
        spec = StoreSpec(
            n=n,
            item_shape=tuple(item_shape),
            dtype=np_dtype.name,
            loader_id=info.loader_id,
            loader_params=info.params,
            rows_per_shard=rows_per_shard(n, item_nbytes, nworkers),
            created_unix=time.time(),
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        collect_debris(target)
        tmp = temp_dir(target)
        io_step("mkdir")
        tmp.mkdir()
        try:
            meta = _build_into(
                tmp, spec, keys, options, workers=nworkers, target=target, probed=probed
            )
            publish(tmp, target, meta, overwrite=options.overwrite)
        except BaseException:
            remove_tree(tmp)
            raise


def _build_into(
    tmp: Path,
    spec: StoreSpec,
    keys: list[str],
    options: BuildOptions,
    *,
    workers: int,
    target: Path,
    probed: tuple[int, npt.NDArray[Any]] | None = None,
) -> GroupMetadata:
    """Write shards, index and array metadata into ``tmp``; return the group metadata.

    ``probed`` is ``(row, value)`` of an item computed already (to learn the item shape).
    """
    n, s = spec.n, spec.rows_per_shard
    if n and spec.item_shape == (0,):
        every = [(k, "the loader failed on every source") for k in keys]
        raise BuildError(_failure_message(every, n, target), every)
    io_step("mkdir")
    (tmp / VECTORS).mkdir()
    tasks = [
        ShardTask(
            root=str(tmp),
            rel=shard_key(spec, k),
            keys=keys[k * s : (k + 1) * s],
            loader=options.loader.fn,
            dtype=spec.dtype,
            item_shape=spec.item_shape,
            rows_per_shard=s,
            write_on_failure=options.on_error == "skip",
        )
        for k in range(math.ceil(n / s))
    ]
    if probed is not None:
        row, value = probed
        tasks[row // s].computed[row % s] = value
    results = run_tasks(
        tasks, workers=workers, progress=options.progress, executor=options.executor,
        target=target, n=n,
    )
    remove_partials(tmp / VECTORS)  # left by attempts killed mid-write, then retried
    failures: list[tuple[int, str, str]] = []
    sizes = np.empty(n, dtype=np.int64)
    mtimes = np.empty(n, dtype=np.int64)
    for k, task in enumerate(tasks):
        res = results[task.rel]
        base = k * s
        failures.extend((base + i, reason, frames) for i, reason, frames in res.failures)
        sizes[base : base + len(task.keys)] = res.source_size
        mtimes[base : base + len(task.keys)] = res.source_mtime_ns
    failures.sort()
    if failures and options.on_error == "raise":
        named = [(keys[i], reason) for i, reason, _frames in failures]
        frames = [f for _i, _reason, f in failures]
        raise BuildError(_failure_message(named, n, target, frames), named)
    if failures:
        keep = np.ones(n, dtype=bool)
        keep[[i for i, _r, _f in failures]] = False
        old_rows = [len(t.keys) for t in tasks]
        spec, files = _drop_failed_rows(tmp, spec, old_rows, keep)
        skipped = tuple((keys[i], reason) for i, reason, _frames in failures)
        spec = dataclasses.replace(spec, skipped=skipped)
        keys = [k for k, ok in zip(keys, keep.tolist(), strict=True) if ok]
        sizes, mtimes = sizes[keep], mtimes[keep]
    else:
        files = {t.rel: (results[t.rel].size, results[t.rel].checksum) for t in tasks}
    return finish_store(tmp, spec, files, keys=keys, sizes=sizes, mtimes=mtimes)


def _drop_failed_rows(
    tmp: Path, spec: StoreSpec, counts: list[int], keep: npt.NDArray[np.bool_]
) -> tuple[StoreSpec, dict[str, tuple[int, str]]]:
    """Rewrite the shards without the rows that failed (``on_error="skip"``)."""
    kept = np.flatnonzero(keep)
    new_spec = dataclasses.replace(spec, n=len(kept))
    s = spec.rows_per_shard
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    maps: dict[int, npt.NDArray[Any]] = {}

    def old(rows: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        block = np.empty((len(rows), *spec.item_shape), dtype=dtype)
        for i, row in enumerate(kept[rows].tolist()):
            k = row // s
            if k not in maps:
                maps[k] = np.memmap(tmp / shard_key(spec, k), dtype=dtype, mode="r",
                                    shape=(counts[k], *spec.item_shape))
            block[i] = maps[k][row % s]
        return block

    staging = tmp / "rewrite"
    io_step("mkdir")
    (staging / VECTORS).mkdir(parents=True)
    files = rewrite_rows(staging, new_spec, old)
    maps.clear()
    shutil.rmtree(tmp / VECTORS)
    io_step("rename")
    (staging / VECTORS).rename(tmp / VECTORS)
    staging.rmdir()
    fsync_dir(tmp)
    return new_spec, files


def _failure_message(
    failures: list[tuple[str, str]], n: int, target: Path, frames: list[str] | None = None
) -> str:
    """Say which sources failed and why, with the loader's last frames of each failure."""
    lines = []
    before = ""
    for k, (p, r) in enumerate(failures[:10]):
        lines.append(f"  {p}: {r}")
        where = frames[k] if frames is not None else ""
        if where and where == before:
            lines.append("      (raised at the same place as above)")
        elif where:
            lines.append(textwrap.indent(where, "    "))
        before = where
    shown = "\n".join(lines)
    more = f"\n  ... and {len(failures) - 10} more (see .failures)" if len(failures) > 10 else ""
    return (
        f"{len(failures)} of {n} sources could not be loaded, so {str(target)!r} was not "
        f"built:\n{shown}{more}\nFix or remove them, or pass on_error='skip' to build the rest."
    )
