"""Building a store: decode in worker processes, write shards, publish atomically.

The coordinator plans the rows into shards, hands whole shards to workers
(never two writers in one shard), then writes the index and the metadata and
publishes the finished directory with a single ``rename``. Everything before
the rename happens in a hidden sibling directory, so a failed or killed build
leaves nothing at the target.

A build to an fsspec URL (:func:`build_to_url`) has its tasks upload the
shards they write; the coordinator assembles the index and the metadata in a
staging directory of the node cache, uploads them with the group
``zarr.json`` last, and keeps that directory as this node's copy. A store of
records is built the same way; its tasks also upload the runs of its ragged
fields (``runs/<field>/<k>``), which the coordinator downloads one batch at a
time, checks, assembles into chunks, uploads with the index and deletes.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import config
from ..config import Recorded
from ..errors import BuildError, StoreExistsError
from ..format import VECTORS, FieldLayout, Fixed, GroupMetadata, StoreSpec, shard_key
from ..fs import (
    collect_temps,
    file_digest,
    make_dir,
    remove_temps,
    remove_tree,
    temp_path,
)
from ..loaders import Loader
from ..remote import (
    discard_files,
    discard_upload,
    download_files,
    shared_between_processes,
    staging_dir,
    upload_store,
    withdraw_store,
)
from .assemble import finish_store, publish, seal
from .batched import Pending, devices_for, first_batch, per_key
from .devices import DeviceStage
from .fields import assemble_fields, drop_rows, prepare_fields, record_spec
from .frames import loader_frames
from .options import BuildOptions
from .pool import BuildPool
from .records import Schema, check_record, infer_schema, is_record
from .reentry import building
from .schedule import run_tasks
from .tasks import (
    RUNS,
    ShardResult,
    ShardTask,
    check_item,
    run_path,
    source_identity,
)

__all__ = [
    "build",
    "build_to_url",
    "collect_debris",
    "default_workers",
    "rows_per_shard",
    "temp_dir",
]


#: Items computed before the shard tasks run (to learn the item shape), by row: each one's
#: value (an array, a checked record, or a :class:`~.batches.Failure` of a batched build) and
#: its source identity ``(size, mtime_ns, content hash)`` taken before the read.
Probed = dict[int, tuple[Any, tuple[int, int, int]]]


def default_workers() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def rows_per_shard(
    n: int, item_nbytes: int, workers: int, shard_bytes: int = config.SHARD_BYTES,
    batch: int = 1,
) -> int:
    """Return the shard length of a store of ``n`` items built by ``workers`` processes.

    At most ``shard_bytes`` of rows (at least one row), fewer for small
    builds so that each worker gets about 8 shards (never fewer than 64
    rows, nor than one ``batch`` of a batch loader), rounded down to a
    multiple of ``PAGE / gcd(item_nbytes, PAGE)`` rows when there are that
    many, so that every shard's data region is a whole number of pages (the
    reader lays shards side by side in one mapping only then), and to a
    multiple of ``batch`` too when there are that many, so that batches are
    whole.

    Examples
    --------
    >>> rows_per_shard(20_000, 512, 2), rows_per_shard(20_000, 512, 2, batch=256)
    (1248, 1024)
    """
    item = max(item_nbytes, 1)
    cap = max(1, shard_bytes // item)
    # ~8 shards per worker so that work balances at the end and progress moves, but no
    # tiny shards
    rows = max(1, min(cap, max(math.ceil(n / (8 * workers)), min(n, config.MIN_SHARD_ROWS),
                               min(n, batch))))
    unit = mmap.PAGESIZE // math.gcd(item, mmap.PAGESIZE)
    whole = math.lcm(unit, batch)
    if batch > 1 and rows >= whole:
        return rows // whole * whole
    return rows // unit * unit if rows >= unit else rows


def temp_dir(target: Path) -> Path:
    """Return a fresh hidden build directory next to ``target`` (not created)."""
    return temp_path(target, "build")


def collect_debris(out: Path, max_age_s: float = 24 * 3600.0, *, any_owner: bool = False) -> None:
    """Remove the temporary entries of ``out`` left by dead processes (build directories and
    what was being created or removed beside it; the current user's only, unless ``any_owner``)."""
    collect_temps(out.parent, max_age_s, target=out.name, any_owner=any_owner)


def _probe(
    loader: Loader, keys: list[str], options: BuildOptions, label: str
) -> tuple[Probed, Schema | None]:
    """Compute the first item the loader succeeds on: ``({index: (value, identity)}, schema)``.

    A record (a dict, or a tuple with ``names``) gives the schema inferred from
    it (None for a tensor). The value is kept and stored as it is: probing
    computes no item twice. Its source's identity is taken before the loader
    reads it, as for every other item.

    Raises
    ------
    BuildError
        If the loader fails on every key, naming each with its error.
    """
    dtype = np.dtype(options.dtype)
    failures: list[tuple[str, str, str]] = []
    probe = ShardTask(root="", rel="", keys=keys, loader=None, dtype="", item_shape=(),
                      rows_per_shard=1, write_on_failure=False,
                      identity=options.identity,
                      tokens=_tokens(options, keys))
    for i, key in enumerate(keys):
        identity = source_identity(probe, i, key)
        try:
            value = loader(key)
            if options.names is not None or is_record(value):
                schema = infer_schema(key, value, options.names)
                return {i: (check_record(key, value, schema, options.names), identity)}, schema
            return {i: (check_item(value, dtype, None), identity)}, None
        except Exception as exc:
            failures.append((key, f"{type(exc).__name__}: {exc}", loader_frames(exc)))
    named = [(k, reason) for k, reason, _frames in failures]
    raise BuildError(_failure_message(named, len(keys), label, [f for _k, _r, f in failures]),
                     named)


def _workers(options: BuildOptions) -> int:
    """The build's worker processes (``options.workers``, or every core).

    Raises
    ------
    ValueError
        If ``options.workers`` is less than 1.
    """
    nworkers = default_workers() if options.workers is None else int(options.workers)
    if nworkers < 1:
        raise ValueError(f"workers must be at least 1, got {options.workers!r}")
    return nworkers


def _plan(
    keys: list[str], options: BuildOptions, label: str, nworkers: int,
    stage: DeviceStage | None = None,
) -> tuple[StoreSpec, Probed | None, Pending | None]:
    """Return the spec of the store of ``keys`` built by ``nworkers`` and the items computed to
    learn the item shape (if any): the first item the loader succeeds on, or with the
    ``stage`` of a batch loader (which is never called here) the first batch it succeeds on,
    and the batches queued behind it, still being computed (see :class:`~.batched.Pending`)."""
    np_dtype = np.dtype(options.dtype)
    info = options.loader
    n = len(keys)
    item_shape = info.item_shape
    schema = options.schema
    probed, pending = None, None
    if schema is None and (item_shape is None or options.names is not None):
        if not keys:
            raise ValueError(
                "no paths to build and the loader does not declare its item_shape; pass at "
                "least one path or give the loader an item_shape attribute"
            )
        if stage is not None:
            probed, pending, schema, item_shape = first_batch(stage, keys, options)
            if schema is None and item_shape is None:
                failures = [(keys[i], row.reason, row.frames) for i, (row, _identity)
                            in sorted(probed.items(), key=lambda item: item[0])]
                named = [(k, r) for k, r, _f in failures]
                raise BuildError(_failure_message(named, len(keys), label,
                                                  [f for _k, _r, f in failures]), named)
        else:
            probed, schema = _probe(per_key(info.fn), keys, options, label)
            if schema is None:
                item_shape = next(iter(probed.values()))[0].shape
    if schema is not None:
        spec = record_spec(n, schema, loader_id=info.loader_id, params=info.params,
                           workers=nworkers, shard_bytes=options.shard_bytes,
                           batch=options.batch_size if stage is not None else 1)
        return dataclasses.replace(spec, identity=_recorded(options)), probed, pending
    assert item_shape is not None
    item_nbytes = int(np.prod(item_shape)) * np_dtype.itemsize
    spec = StoreSpec(
        n=n,
        item_shape=tuple(item_shape),
        dtype=np_dtype.name,
        loader_id=info.loader_id,
        loader_params=info.params,
        rows_per_shard=rows_per_shard(n, item_nbytes, nworkers, options.shard_bytes,
                                      options.batch_size if stage is not None else 1),
        created_unix=time.time(),
        identity=_recorded(options),
    )
    return spec, probed, pending


def _recorded(options: BuildOptions) -> Recorded:
    """What the store's metadata records: a ``"content"`` build records each source's stat
    (its content hashes lie beside a cache's part)."""
    return "stat" if options.identity == "content" else options.identity


def build(
    keys: list[str], target: Path, options: BuildOptions
) -> npt.NDArray[np.uint64] | None:
    """Build the store of ``keys`` at ``target`` and publish it atomically.

    Parameters
    ----------
    keys
        Distinct normalised keys, in row order.
    target
        The store directory to create (replaced with ``options.overwrite``).
    options
        How to build.

    Returns
    -------
    numpy.ndarray or None
        The content hashes of the published rows' sources, in row order (0:
        none taken), None if none was taken. They are not part of the store:
        a cache keeps them beside its part (see
        :mod:`tensorstore_cache.format.hashes`).

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
        nworkers = _workers(options)
        with devices_for(options, keys, nworkers) as (stage, pool):
            spec, probed, pending = _plan(keys, options, str(target), nworkers, stage)
            target.parent.mkdir(parents=True, exist_ok=True)
            collect_debris(target)
            tmp = temp_dir(target)
            make_dir(tmp, options.trust, exist_ok=False)
            try:
                meta, _sent, hashes = _build_into(
                    tmp, spec, keys, options, workers=nworkers, label=str(target),
                    probed=probed, pending=pending, stage=stage, pool=pool,
                )
                publish(tmp, target, meta, overwrite=options.overwrite, trust=options.trust)
            except BaseException:
                remove_tree(tmp)
                raise
    return hashes if bool(np.any(hashes != 0)) else None


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

    A store of records: the tasks upload the shards of its fixed fields, and
    the values of its ragged and text fields as runs (``runs/<field>/<k>``);
    this process downloads the runs (each checked against the size and
    XXH3-128 its task reported), writes the chunks, offsets and shapes,
    uploads them with the index, and deletes the runs.

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
        nworkers = _workers(options)
        with building(local), devices_for(options, keys, nworkers) as (stage, pool):
            spec, probed, pending = _plan(keys, options, url, nworkers, stage)
            make_dir(local, options.trust, exist_ok=False)
            if options.overwrite:
                withdraw_store(url, storage_options=storage_options)
            try:
                meta, sent, _hashes = _build_into(
                    local, spec, keys, options, workers=nworkers, label=url, probed=probed,
                    pending=pending, upload=upload, storage_options=options_dict, stage=stage,
                    pool=pool,
                )
                seal(local, meta, url, options.trust)
                upload_store(local, url, uploaded=sent, overwrite=options.overwrite,
                             cache_dir=cache_dir, storage_options=storage_options,
                             trust=options.trust, scratch=(RUNS,))
            except BaseException as exc:
                try:
                    discard_upload(url, storage_options=storage_options, scratch=(RUNS,))
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
    probed: Probed | None = None,
    pending: Pending | None = None,
    upload: str | None = None,
    storage_options: dict[str, Any] | None = None,
    stage: DeviceStage | None = None,
    pool: BuildPool | None = None,
) -> tuple[GroupMetadata, frozenset[str], npt.NDArray[np.uint64]]:
    """Write shards, index and array metadata into ``tmp``; return the group metadata.

    ``label`` names the build's target in messages. ``probed`` holds items
    computed already (to learn the item shape), ``pending`` those still being computed then
    (taken in this process before its first task, the pool's first tasks being sent
    before if they do not need them). ``stage`` is what the tasks of a batch loader
    run instead of the loader, ``pool`` its CPU workers started already. With ``upload`` (a URL) the
    tasks upload their shards there instead; the shards that are there, not
    in ``tmp``, are returned with the metadata, and so are the content hashes
    of the rows' sources (0: none taken).
    """
    n, s = spec.n, spec.rows_per_shard
    if spec.records:
        prepare_fields(tmp, spec, options.trust)
    else:
        make_dir(tmp / VECTORS, options.trust, exist_ok=False)
    fixed = tuple(f for f in spec.fields if isinstance(f.field, Fixed))
    tasks = [
        ShardTask(
            root=str(tmp),
            rel=_task_name(spec, fixed, k),
            keys=keys[k * s : (k + 1) * s],
            loader=per_key(options.loader.fn) if stage is None else stage,
            dtype=spec.dtype or "",
            item_shape=spec.item_shape or (),
            rows_per_shard=s,
            write_on_failure=options.on_error == "skip",
            identity=options.identity,
            tokens=_tokens(options, keys[k * s : (k + 1) * s]),
            schema=spec.schema or None,
            names=options.names,
            k=k,
            layouts=fixed,
            trust=options.trust,
            upload=upload,
            storage_options=storage_options,
        )
        for k in range(math.ceil(n / s))
    ]
    for row, done in (probed or {}).items():
        tasks[row // s].computed[row % s] = done
    if stage is not None:  # the CPU workers connect to the device workers at once
        stage.wait_started()

    def take_pending() -> None:
        assert pending is not None
        for row, done in pending.finish().items():
            tasks[row // s].computed[row % s] = done

    # the pool's first tasks are sent from the front before this process takes any
    later = (pending is not None and pool is not None and options.executor is None
             and pending.rows.start // s >= 2 * pool.size)
    if pending is not None and not later:
        take_pending()
    results = run_tasks(
        tasks, workers=workers, progress=options.progress, executor=options.executor,
        target=Path(label), n=n, label=options.label, pool=pool,
        local_first=take_pending if later else None,
    )
    for layout in spec.layouts():  # left by attempts killed mid-write, then retried
        if isinstance(layout.field, Fixed) and (tmp / layout.path).is_dir():
            remove_temps(tmp / layout.path)
    failures: list[tuple[int, str, str]] = []
    sizes = np.empty(n, dtype=np.int64)
    mtimes = np.empty(n, dtype=np.int64)
    hashes = np.empty(n, dtype=np.uint64)
    for k, task in enumerate(tasks):
        res = results[task.rel]
        base = k * s
        failures.extend((base + i, reason, frames) for i, reason, frames in res.failures)
        sizes[base : base + len(task.keys)] = res.source_size
        mtimes[base : base + len(task.keys)] = res.source_mtime_ns
        hashes[base : base + len(task.keys)] = res.source_hash
    failures.sort()
    if failures and options.on_error == "raise":
        named = [(keys[i], reason) for i, reason, _frames in failures]
        frames = [f for _i, _reason, f in failures]
        raise BuildError(_failure_message(named, n, label, frames), named)
    uploaded = _sent_files(spec, [results[t.rel] for t in tasks])
    sent = frozenset(uploaded) if upload is not None else frozenset()
    if failures:
        if upload is not None:  # the rows that failed are dropped from local copies
            download_files(upload, sorted(sent), tmp, storage_options=storage_options)
            for rel in sorted(sent):
                if file_digest(tmp / rel) != uploaded[rel]:
                    raise BuildError(
                        f"shard {rel} read back from {upload!r} differs from what its task "
                        "uploaded (another builder writing there?); nothing was published"
                    )
            sent = frozenset()
        keep = np.ones(n, dtype=bool)
        keep[[i for i, _r, _f in failures]] = False
        old_rows = [len(t.keys) for t in tasks]
        spec, files = drop_rows(tmp, spec, old_rows, keep, options.trust)
        skipped = tuple((keys[i], reason) for i, reason, _frames in failures)
        spec = dataclasses.replace(spec, skipped=skipped)
        keys = [k for k, ok in zip(keys, keep.tolist(), strict=True) if ok]
        sizes, mtimes, hashes = sizes[keep], mtimes[keep], hashes[keep]
    elif spec.records:
        files = {rel: entry for t in tasks for rel, entry in results[t.rel].files.items()}
    else:
        files = {t.rel: (results[t.rel].size, results[t.rel].checksum) for t in tasks}
    if spec.records:
        if upload is not None:
            _download_runs(upload, tmp, [results[t.rel] for t in tasks], storage_options)
        spec, files = assemble_fields(tmp, spec, [results[t.rel] for t in tasks], files,
                                      options.trust, options.shard_bytes)
    meta = finish_store(
        tmp, spec, files, keys=keys, sizes=sizes, mtimes=mtimes, trust=options.trust
    )
    return meta, sent, hashes


def _sent_files(spec: StoreSpec, results: list[ShardResult]) -> dict[str, tuple[int, str]]:
    """The data files the shard tasks wrote (or uploaded), with their size and XXH3-128."""
    if spec.records:
        return {rel: entry for r in results for rel, entry in r.files.items()}
    return {r.rel: (r.size, r.checksum) for r in results}


#: Runs downloaded at once by a build of records to a URL (each is one task's values of one
#: field: at most a shard's worth).
_RUNS_AT_ONCE = 8


def _download_runs(
    url: str, tmp: Path, results: list[ShardResult], storage_options: dict[str, Any] | None
) -> None:
    """Download the ragged runs the tasks of a build of records uploaded to ``url`` into the
    build directory ``tmp``, where a local build's tasks leave them, each checked against
    what its task wrote; then delete them at ``url``.

    Raises
    ------
    BuildError
        If a run differs from what its task reported (nothing is published).
    """
    wanted = [(run_path(Path(), name, k).as_posix(), entry)
              for k, r in enumerate(results) for name, entry in r.run_files.items()]
    for at in range(0, len(wanted), _RUNS_AT_ONCE):
        batch = wanted[at : at + _RUNS_AT_ONCE]
        download_files(url, [rel for rel, _e in batch], tmp, storage_options=storage_options)
        for rel, entry in batch:
            if file_digest(tmp / rel) != entry:
                raise BuildError(
                    f"{rel} read back from {url!r} differs from what its task uploaded "
                    "(another builder writing there?); nothing was published"
                )
    discard_files(url, [rel for rel, _e in wanted], storage_options=storage_options)


def _tokens(options: BuildOptions, keys: list[str]) -> list[int] | None:
    """The version tokens of ``keys`` (``identity="token"``), else None."""
    if options.identity != "token":
        return None
    assert options.tokens is not None
    return [options.tokens[k] for k in keys]


def _task_name(spec: StoreSpec, fixed: tuple[FieldLayout, ...], k: int) -> str:
    """What shard task ``k`` is named by in results and messages: the shard it writes."""
    if not spec.records:
        return shard_key(spec, k)
    if fixed:
        return fixed[0].chunk_key(k)
    return f"{RUNS}/{k}"


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
