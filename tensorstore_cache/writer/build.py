"""Building a store: decode in worker processes, write shards, publish atomically.

The coordinator plans the rows into shards, hands whole shards to workers
(never two writers in one shard), then writes the index and the metadata and
publishes the finished directory with a single ``rename``. Everything before
the rename happens in a hidden sibling directory, so a failed or killed build
leaves nothing at the target.

A build to an fsspec URL (:func:`build_to_url`) has its tasks upload the
shards they write; the coordinator assembles the index and the metadata in a
staging directory of the node cache, uploads them with the group
``zarr.json`` last, and keeps that directory as this node's copy.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import shutil
import textwrap
import time
from collections.abc import Mapping
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
from ..fs.durable import file_digest, fsync_dir, io_step, remove_partials
from ..fs.temp import collect_temp_siblings, remove_tree, temp_sibling
from ..fs.trust import EXPLICIT, Trust, make_dir
from ..loaders import Loader, LoaderInfo
from ..remote.upload import (
    discard_upload,
    download_files,
    shared_between_processes,
    staging_dir,
    upload_store,
    withdraw_store,
)
from .assemble import finish_store, publish, rewrite_rows, seal
from .reentry import building
from .schedule import run_tasks
from .tasks import ShardTask, load_item

__all__ = [
    "BuildOptions",
    "build",
    "build_dir_target",
    "build_to_url",
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
    trust: Trust = EXPLICIT
    """Whose store it is: the modes of every directory and file created (a cache's
    private or shared modes; a path the user names: the umask's)."""
    shard_bytes: int = config.SHARD_BYTES
    """Target size of one shard file."""


def default_workers() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def rows_per_shard(
    n: int, item_nbytes: int, workers: int, shard_bytes: int = config.SHARD_BYTES
) -> int:
    """Return the shard length of a store of ``n`` items built by ``workers`` processes.

    At most ``shard_bytes`` of rows (at least one row), fewer for small
    builds so that each worker gets about 8 shards (never fewer than 64
    rows), rounded down to a multiple of ``PAGE / gcd(item_nbytes, PAGE)``
    rows when there are that many, so that every shard's data region is a
    whole number of pages (the reader lays shards side by side in one
    mapping only then).
    """
    item = max(item_nbytes, 1)
    cap = max(1, shard_bytes // item)
    # ~8 shards per worker so that work balances at the end and progress moves, but no
    # tiny shards
    rows = max(1, min(cap, max(math.ceil(n / (8 * workers)), min(n, 64))))
    unit = mmap.PAGESIZE // math.gcd(item, mmap.PAGESIZE)
    return rows // unit * unit if rows >= unit else rows


def temp_dir(target: Path) -> Path:
    """Return a fresh hidden build directory next to ``target`` (not created)."""
    return temp_sibling(target, config.BUILD_MARK)


def collect_debris(out: Path, max_age_s: float = 24 * 3600.0, *, any_owner: bool = False) -> None:
    """Remove temporary build directories of ``out`` left by dead builders (the current
    user's only, unless ``any_owner``)."""
    collect_temp_siblings(out.parent, f".{out.name}{config.BUILD_MARK}", max_age_s,
                          any_owner=any_owner)


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


def _plan(
    keys: list[str], options: BuildOptions
) -> tuple[StoreSpec, int, tuple[int, npt.NDArray[Any]] | None]:
    """Return the spec of the store of ``keys``, the worker count and a probed item (if any)."""
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
        rows_per_shard=rows_per_shard(n, item_nbytes, nworkers, options.shard_bytes),
        created_unix=time.time(),
    )
    return spec, nworkers, probed


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
        spec, nworkers, probed = _plan(keys, options)
        target.parent.mkdir(parents=True, exist_ok=True)
        collect_debris(target)
        tmp = temp_dir(target)
        io_step("mkdir")
        make_dir(tmp, options.trust, exist_ok=False)
        try:
            meta, _sent = _build_into(
                tmp, spec, keys, options, workers=nworkers, label=str(target), probed=probed
            )
            publish(tmp, target, meta, overwrite=options.overwrite, trust=options.trust)
        except BaseException:
            remove_tree(tmp)
            raise


def build_to_url(
    keys: list[str],
    url: str,
    options: BuildOptions,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Build the store of ``keys`` at the fsspec URL ``url``, its shards uploaded by their tasks.

    Each shard task writes its shard to a local temporary file and uploads it
    from the process (or machine) that runs it. This process then writes the
    index and the metadata into a staging directory of the node cache,
    uploads them, the group ``zarr.json`` last, and keeps the directory as
    this node's copy of the new version (its shards are fetched when first
    read). With ``options.overwrite`` the old group ``zarr.json`` is
    deleted before the first shard is sent (shards are replaced in place),
    so the old store is gone from ``url`` from then on, also if the build
    fails. A build that fails deletes the files it sent, and never writes a
    group ``zarr.json``; a task still running on a given executor then may
    upload its shard afterwards, which no reader sees and the next build
    there deletes. A ``memory://`` URL, which only this process sees,
    has its shards written into the staging directory and uploaded from here.

    Raises
    ------
    BuildError
        If sources failed and ``options.on_error == "raise"``.
    """
    staging = staging_dir(url, cache_dir, trust=options.trust)
    local = staging / "store"
    options_dict = dict(storage_options) if storage_options is not None else None
    upload = url if shared_between_processes(url, storage_options) else None
    try:
        with building(local):
            spec, nworkers, probed = _plan(keys, options)
            io_step("mkdir")
            make_dir(local, options.trust, exist_ok=False)
            if options.overwrite:
                withdraw_store(url, storage_options=storage_options)
            try:
                meta, sent = _build_into(
                    local, spec, keys, options, workers=nworkers, label=url, probed=probed,
                    upload=upload, storage_options=options_dict,
                )
                seal(local, meta, url, options.trust)
                upload_store(local, url, uploaded=sent, overwrite=options.overwrite,
                             cache_dir=cache_dir, storage_options=storage_options,
                             trust=options.trust)
            except BaseException as exc:
                try:
                    discard_upload(url, storage_options=storage_options)
                except Exception as cleanup:
                    exc.add_note(
                        f"the files this build uploaded to {url!r} could not all be deleted "
                        f"({type(cleanup).__name__}: {cleanup}); no group zarr.json names them, "
                        "so no reader sees them, and the next build there replaces them"
                    )
                raise
    finally:
        remove_tree(staging)


def _build_into(
    tmp: Path,
    spec: StoreSpec,
    keys: list[str],
    options: BuildOptions,
    *,
    workers: int,
    label: str,
    probed: tuple[int, npt.NDArray[Any]] | None = None,
    upload: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[GroupMetadata, frozenset[str]]:
    """Write shards, index and array metadata into ``tmp``; return the group metadata.

    ``label`` names the build's target in messages. ``probed`` is ``(row,
    value)`` of an item computed already (to learn the item shape). With
    ``upload`` (a URL) the tasks upload their shards there instead; the
    shards that are there, not in ``tmp``, are returned with the metadata.
    """
    n, s = spec.n, spec.rows_per_shard
    if n and spec.item_shape == (0,):
        every = [(k, "the loader failed on every source") for k in keys]
        raise BuildError(_failure_message(every, n, label), every)
    io_step("mkdir")
    make_dir(tmp / VECTORS, options.trust, exist_ok=False)
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
            trust=options.trust,
            upload=upload,
            storage_options=storage_options,
        )
        for k in range(math.ceil(n / s))
    ]
    if probed is not None:
        row, value = probed
        tasks[row // s].computed[row % s] = value
    results = run_tasks(
        tasks, workers=workers, progress=options.progress, executor=options.executor,
        target=Path(label), n=n,
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
        raise BuildError(_failure_message(named, n, label, frames), named)
    sent = frozenset(t.rel for t in tasks) if upload is not None else frozenset()
    if failures:
        if upload is not None:  # the rows that failed are dropped from local copies
            download_files(upload, sorted(sent), tmp, storage_options=storage_options)
            for rel in sorted(sent):
                if file_digest(tmp / rel) != (results[rel].size, results[rel].checksum):
                    raise BuildError(
                        f"shard {rel} read back from {upload!r} differs from what its task "
                        "uploaded (another builder writing there?); nothing was published"
                    )
            sent = frozenset()
        keep = np.ones(n, dtype=bool)
        keep[[i for i, _r, _f in failures]] = False
        old_rows = [len(t.keys) for t in tasks]
        spec, files = _drop_failed_rows(tmp, spec, old_rows, keep, options.trust)
        skipped = tuple((keys[i], reason) for i, reason, _frames in failures)
        spec = dataclasses.replace(spec, skipped=skipped)
        keys = [k for k, ok in zip(keys, keep.tolist(), strict=True) if ok]
        sizes, mtimes = sizes[keep], mtimes[keep]
    else:
        files = {t.rel: (results[t.rel].size, results[t.rel].checksum) for t in tasks}
    meta = finish_store(
        tmp, spec, files, keys=keys, sizes=sizes, mtimes=mtimes, trust=options.trust
    )
    return meta, sent


def _drop_failed_rows(
    tmp: Path, spec: StoreSpec, counts: list[int], keep: npt.NDArray[np.bool_], trust: Trust
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
    make_dir(staging, trust, exist_ok=False)
    make_dir(staging / VECTORS, trust, exist_ok=False)
    files = rewrite_rows(staging, new_spec, old, trust)
    maps.clear()
    shutil.rmtree(tmp / VECTORS)
    io_step("rename")
    (staging / VECTORS).rename(tmp / VECTORS)
    staging.rmdir()
    fsync_dir(tmp)
    return new_spec, files


def _failure_message(
    failures: list[tuple[str, str]], n: int, target: str, frames: list[str] | None = None
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
        f"{len(failures)} of {n} sources could not be loaded, so {target!r} was not "
        f"built:\n{shown}{more}\nFix or remove them, or pass on_error='skip' to build the rest."
    )
