"""A planned build executed in its build directory: shard tasks run, failures dropped, the
store assembled (everything but its publication).

The shard tasks are made from the plan's shard layout, given the items the
probe computed, and run (:func:`~.schedule.run_tasks`). The rows whose
sources failed fail the build, or with ``on_error="skip"`` are dropped from
the shards; a store of records then has its ragged fields assembled from the
runs its tasks left; last, the index and the array metadata are written. A
build to a URL has its tasks upload what they write: the shards of a build
that skipped rows are downloaded back (to drop the rows here), and the runs
of a store of records are downloaded, each checked against what its task
reported, and deleted there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BuildError
from ..format import VECTORS, FieldLayout, Fixed, GroupMetadata, StoreSpec, shard_key
from ..fs import file_digest, make_dir, remove_temps
from ..remote import discard_files, download_files
from .assemble import Files, finish_store
from .fields import assemble_fields, drop_rows, prepare_fields
from .frames import sources_failed
from .layout import shard_rows
from .plan import Plan
from .schedule import run_tasks
from .tasks import RUNS, Computed, ShardResult, ShardTask, run_path

__all__ = ["Upload", "execute"]

#: Runs downloaded at once by a build of records to a URL (each is one task's values of one
#: field: at most a shard's worth).
_RUNS_AT_ONCE = 8


@dataclass(frozen=True, slots=True)
class Upload:
    """Where the shard tasks of a build to a URL upload what they write."""

    url: str
    """The store's URL."""
    storage_options: dict[str, Any] | None = None
    """The URL's filesystem options."""


@dataclass(slots=True)
class _Rows:
    """The rows of a build once its tasks ran: keys, source identities and failures."""

    keys: list[str]
    sizes: npt.NDArray[np.int64]
    mtimes: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.uint64]
    failures: list[tuple[int, str, str]]
    """``(row, "Type: message", the loader's frames)`` of every failing source, by row."""


def execute(
    tmp: Path, plan: Plan, upload: Upload | None = None
) -> tuple[GroupMetadata, frozenset[str], npt.NDArray[np.uint64]]:
    """Build the planned store in ``tmp`` (everything but its group metadata).

    Parameters
    ----------
    tmp
        The build directory (created, empty).
    plan
        The build.
    upload
        Where the tasks upload the shards instead of writing them into ``tmp``.

    Returns
    -------
    tuple
        The group metadata to write last; the data files that are at
        ``upload``, not in ``tmp``; the content hashes of the rows' sources
        (0: none taken), in row order.

    Raises
    ------
    BuildError
        If sources failed and ``on_error="raise"``, or a file read back from
        ``upload`` differs from what its task uploaded.
    """
    spec, trust = plan.spec, plan.options.trust
    if spec.records:
        prepare_fields(tmp, spec, trust)
    else:
        make_dir(tmp / VECTORS, trust, exist_ok=False)
    tasks = _tasks(tmp, plan, upload)
    results = _run(plan, tasks)
    for layout in spec.layouts():  # left by attempts killed mid-write, then retried
        if isinstance(layout.field, Fixed) and (tmp / layout.path).is_dir():
            remove_temps(tmp / layout.path)
    rows = _gather(plan, results)
    if rows.failures and plan.options.on_error == "raise":
        raise sources_failed([(plan.keys[i], reason, frames)
                              for i, reason, frames in rows.failures], spec.n, plan.label)
    files = _sent_files(spec, results)
    sent = frozenset(files) if upload is not None else frozenset()
    if rows.failures:
        if upload is not None:  # the rows that failed are dropped from local copies
            _download_checked(upload, sorted(files.items()), tmp, "shard ")
            sent = frozenset()
        spec, files = _drop_failed(tmp, plan, tasks, rows)
    if spec.records:
        if upload is not None:
            _download_runs(upload, tmp, results)
        spec, files = assemble_fields(tmp, spec, results, files, trust,
                                      plan.options.shard_bytes)
    meta = finish_store(tmp, spec, files, keys=rows.keys, sizes=rows.sizes,
                        mtimes=rows.mtimes, trust=trust)
    return meta, sent, rows.hashes


def _tasks(tmp: Path, plan: Plan, upload: Upload | None) -> list[ShardTask]:
    """The shard tasks of the plan, one per shard, given the items computed already."""
    spec, options, s = plan.spec, plan.options, plan.spec.rows_per_shard
    fixed = tuple(f for f in spec.fields if isinstance(f.field, Fixed))
    rows = shard_rows(spec.n, s)
    loader = plan.loader() if rows else None
    tasks = [
        ShardTask(
            root=str(tmp), rel=_task_name(spec, fixed, k), keys=plan.keys[r.start : r.stop],
            loader=loader, dtype=spec.dtype or "", item_shape=spec.item_shape or (),
            rows_per_shard=s, write_on_failure=options.on_error == "skip",
            identity=options.identity, tokens=_tokens(plan, r), schema=spec.schema or None,
            names=options.names, k=k, layouts=fixed, trust=options.trust,
            upload=None if upload is None else upload.url,
            storage_options=None if upload is None else upload.storage_options,
        )
        for k, r in enumerate(rows)
    ]
    _place(tasks, s, plan.computed)
    return tasks


def _place(tasks: list[ShardTask], s: int, computed: Computed) -> None:
    """Give the shard tasks (of ``s`` rows each) the items computed already, by build row."""
    for row, done in computed.items():
        tasks[row // s].computed[row % s] = done


def _run(plan: Plan, tasks: list[ShardTask]) -> list[ShardResult]:
    """Run the tasks; their results, in task order.

    The probe's batches still computing are taken in this process before its
    first task (the pool's first tasks are sent before if they do not need
    them).
    """
    if plan.stage is not None:  # the CPU workers connect to the device workers at once
        plan.stage.wait_started()
    pending, pool, options = plan.pending, plan.pool, plan.options

    def take_pending() -> None:
        assert pending is not None
        _place(tasks, plan.spec.rows_per_shard, pending.finish())

    # the pool's first tasks are sent from the front before this process takes any
    later = (pending is not None and pool is not None and options.executor is None
             and pending.rows.start // plan.spec.rows_per_shard >= 2 * pool.size)
    if pending is not None and not later:
        take_pending()
    results = run_tasks(
        tasks, workers=plan.workers, progress=options.progress, executor=options.executor,
        target=Path(plan.label), n=plan.spec.n, label=options.label, pool=pool,
        local_first=take_pending if later else None,
    )
    return [results[t.rel] for t in tasks]


def _gather(plan: Plan, results: list[ShardResult]) -> _Rows:
    """Every row's source identity and every failure, by build row."""
    n = plan.spec.n
    rows = _Rows(list(plan.keys), np.empty(n, np.int64), np.empty(n, np.int64),
                 np.empty(n, np.uint64), [])
    for res, span in zip(results, shard_rows(n, plan.spec.rows_per_shard), strict=True):
        rows.failures.extend((span.start + i, reason, frames)
                             for i, reason, frames in res.failures)
        rows.sizes[span.start : span.stop] = res.source_size
        rows.mtimes[span.start : span.stop] = res.source_mtime_ns
        rows.hashes[span.start : span.stop] = res.source_hash
    rows.failures.sort()
    return rows


def _drop_failed(
    tmp: Path, plan: Plan, tasks: list[ShardTask], rows: _Rows
) -> tuple[StoreSpec, Files]:
    """Drop the rows that failed from the shards in ``tmp`` and from ``rows``; the spec and
    data files of the store of the rest."""
    keep = np.ones(plan.spec.n, dtype=bool)
    keep[[i for i, _r, _f in rows.failures]] = False
    spec, files = drop_rows(tmp, plan.spec, [len(t.keys) for t in tasks], keep,
                            plan.options.trust)
    skipped = tuple((rows.keys[i], reason) for i, reason, _frames in rows.failures)
    rows.keys = [k for k, ok in zip(rows.keys, keep.tolist(), strict=True) if ok]
    rows.sizes, rows.mtimes, rows.hashes = rows.sizes[keep], rows.mtimes[keep], rows.hashes[keep]
    return dataclasses.replace(spec, skipped=skipped), files


def _sent_files(spec: StoreSpec, results: list[ShardResult]) -> Files:
    """The data files the shard tasks wrote (or uploaded), with their size and XXH3-128."""
    if spec.records:
        return {rel: entry for r in results for rel, entry in r.files.items()}
    return {r.rel: (r.size, r.checksum) for r in results}


def _download_checked(
    upload: Upload, wanted: list[tuple[str, tuple[int, str]]], tmp: Path, what: str = "",
    at_once: int | None = None,
) -> None:
    """Download the files ``wanted`` from ``upload`` into ``tmp`` (``at_once`` at a time, or
    all), each checked against the size and XXH3-128 its task reported.

    Raises
    ------
    BuildError
        If a file differs (``what`` prefixes its name in the message).
    """
    step = at_once or max(1, len(wanted))
    for at in range(0, len(wanted), step):
        batch = wanted[at : at + step]
        download_files(upload.url, [rel for rel, _e in batch], tmp,
                       storage_options=upload.storage_options)
        for rel, entry in batch:
            if file_digest(tmp / rel) != entry:
                raise BuildError(
                    f"{what}{rel} read back from {upload.url!r} differs from what its task "
                    "uploaded (another builder writing there?); nothing was published"
                )


def _download_runs(upload: Upload, tmp: Path, results: list[ShardResult]) -> None:
    """Download the ragged runs the tasks of a build of records uploaded into the build
    directory ``tmp``, where a local build's tasks leave them, each checked against what its
    task wrote; then delete them at the URL."""
    wanted = [(run_path(Path(), name, k).as_posix(), entry)
              for k, r in enumerate(results) for name, entry in r.run_files.items()]
    _download_checked(upload, wanted, tmp, at_once=_RUNS_AT_ONCE)
    discard_files(upload.url, [rel for rel, _e in wanted],
                  storage_options=upload.storage_options)


def _tokens(plan: Plan, rows: range) -> list[int] | None:
    """The version tokens of the keys of ``rows`` (``identity="token"``), else None."""
    if plan.options.identity != "token":
        return None
    assert plan.options.tokens is not None
    return [plan.options.tokens[k] for k in plan.keys[rows.start : rows.stop]]


def _task_name(spec: StoreSpec, fixed: tuple[FieldLayout, ...], k: int) -> str:
    """What shard task ``k`` is named by in results and messages: the shard it writes."""
    if not spec.records:
        return shard_key(spec, k)
    if fixed:
        return fixed[0].chunk_key(k)
    return f"{RUNS}/{k}"
