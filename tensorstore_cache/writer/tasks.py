"""Shard tasks: decode the sources of one shard and write it, in whatever process runs it.

A :class:`ShardTask` is everything needed to produce one shard file and is
picklable, so any :class:`concurrent.futures.Executor` can run it (a Dask
client's executor for a cluster); :mod:`.schedule` runs a build's tasks.
A task of a build to a URL writes its shard to a local temporary file and
uploads it from where it runs, so no directory is shared between the
builder and the workers. A task of a store of records uploads the shards of
its fixed fields the same way, and each ragged field's run as the object
``runs/<field>/<k>`` at the URL (the builder downloads the runs, assembles
the chunks and deletes them: a builder's memory never holds more than one
run, however large the ragged values).
"""

from __future__ import annotations

import abc
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config import SourceCheck
from ..format import VECTORS, FieldLayout, Fixed
from ..fs import EXPLICIT, Trust, identify, write_replace
from ..loaders import Loader
from ..remote import upload_file
from .assemble import write_shard_file
from .frames import loader_frames
from .ragged import ragged_values
from .records import Schema, record_checker

__all__ = [
    "BatchStage",
    "Computed",
    "Failure",
    "NotAFileError",
    "RUNS",
    "Row",
    "ShardResult",
    "ShardTask",
    "SourceStat",
    "check_item",
    "checker",
    "compute",
    "run_path",
    "run_shard",
    "source_identity",
]

#: Directory of a build where shard tasks leave the values of ragged fields.
RUNS = "runs"

#: What is recorded about a source, taken before it is read: ``(size, mtime_ns, content
#: hash)`` (-1, -1 without a stat; the version token in place of the mtime; hash 0: none).
SourceStat = tuple[int, int, int]

#: A row of a shard task: its value (checked) or its :class:`Failure`.
Row = Any

#: Items computed before their shard task runs, by row: each one's row and its source's
#: :data:`SourceStat`.
Computed = dict[int, tuple[Row, SourceStat]]


@dataclass(frozen=True, slots=True)
class Failure:
    """A key the build could not compute: why (``"Type: message"``) and the loader's frames."""

    reason: str
    frames: str


class BatchStage(abc.ABC):
    """What the shard tasks of a build by a batch loader run instead of a loader of one key:
    the stage of :mod:`.device`, which computes a shard's rows together (the tasks know it by
    this class only)."""

    __slots__ = ()

    @abc.abstractmethod
    def rows(
        self, keys: list[str], k: int, check: Callable[[str, Any], Any],
        names: tuple[str, ...] | None,
    ) -> list[Row]:
        """The rows of ``keys`` of shard task ``k``, in key order: each its value, checked
        by ``check(key, value)``, or a :class:`Failure`; ``names`` orders the fields of a
        loader's tuples."""



def check_item(value: Any, dtype: np.dtype[Any], shape: tuple[int, ...] | None) -> npt.NDArray[Any]:
    """Check a loader's result (one tensor): its shape and dtype, converted to ``dtype``."""
    value = np.asarray(value)
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
    checked: npt.NDArray[Any] = value
    return checked


@dataclass(slots=True, kw_only=True)
class ShardTask:
    """Everything a worker needs to produce one shard (picklable).

    ``loader`` is None in the tasks sent to a :class:`~.pool.BuildPool`,
    whose workers received the loader when they started. ``computed`` holds
    items computed already, by row in the shard, with their source identity
    taken before they were read (the one that told the builder the item
    shape). ``identity`` says what is recorded about the sources: their stat
    (``"stat"``), their stat and content hash (``"content"``, taken before it
    is read; racily clean sources get a hash anyway), nothing (``"none"``: no system call on a key), or ``tokens`` (one per
    key, given by the caller). ``trust`` gives the shard's directories and file
    the modes of the cache (or store) being built, in whatever process writes it.
    With ``upload`` (the store's URL) the shard is written to a local temporary
    file and uploaded there, ``root`` is not written; ``storage_options`` are
    the URL's filesystem options.

    A task of a store of records has ``schema`` (and ``names``, the order of
    a loader's tuples), ``k`` its shard number and ``layouts`` the store's
    fixed fields: it writes shard ``k`` of each, and the values of each ragged
    or text field into ``runs/<field>/<k>`` of the build directory, for the
    builder to assemble into chunks (``dtype`` and ``item_shape`` are unused).
    With ``upload``, the shards and the runs are uploaded under the same
    names instead.
    """

    root: str
    rel: str
    keys: list[str]
    loader: Loader | BatchStage | None
    dtype: str
    item_shape: tuple[int, ...]
    rows_per_shard: int
    write_on_failure: bool
    computed: Computed = field(default_factory=dict)
    identity: SourceCheck = "stat"
    tokens: list[int] | None = None
    schema: Schema | None = None
    names: tuple[str, ...] | None = None
    k: int = 0
    layouts: tuple[FieldLayout, ...] = ()
    trust: Trust = EXPLICIT
    upload: str | None = None
    #: may hold credentials: never in a repr (an executor's log line, a traceback)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(slots=True)
class ShardResult:
    """What a worker reports back for one shard.

    ``failures`` holds ``(row in the shard, "Type: message", the loader's
    last frames)`` of every source the loader failed on. The source identity
    of every row was taken before its source was read (``source_hash``: 0
    where no content hash was taken).
    """

    rel: str
    size: int = 0
    checksum: str = ""
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    source_size: list[int] = field(default_factory=list)
    source_mtime_ns: list[int] = field(default_factory=list)
    source_hash: list[int] = field(default_factory=list)
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Records: the shard files of the fixed fields written."""
    runs: dict[str, tuple[list[int], list[list[int]] | None]] = field(default_factory=dict)
    """Records: each ragged or text field's run, as every written row's length (and
    varying sizes); the rows that failed are not in it."""
    run_files: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Records built to a URL: the size and XXH3-128 of each ragged field's uploaded run
    (``runs/<field>/<k>``), checked when the builder downloads it."""


def run_shard(task: ShardTask, loader: Loader | BatchStage | None = None) -> ShardResult:
    """Decode every key of one shard and write the shard file (in a worker).

    ``loader`` is used instead of ``task.loader`` when given: a loader of
    one key, or the :class:`BatchStage` of a batched build.
    """
    fn = loader if loader is not None else task.loader
    if fn is None:
        raise ValueError(f"shard task {task.rel} has no loader")
    if task.schema is not None:
        return _run_records(task, fn, task.schema)
    block = np.zeros((len(task.keys), *task.item_shape), dtype=np.dtype(task.dtype))
    result = ShardResult(task.rel)
    compute(task, fn, checker(task), block.__setitem__, result)
    if result.failures and not task.write_on_failure:
        return result
    if task.upload is None:
        result.size, result.checksum = write_shard_file(
            Path(task.root), task.rel, block, task.rows_per_shard, task.trust
        )
        return result
    with tempfile.TemporaryDirectory(prefix="tsc-shard-") as scratch:
        (Path(scratch) / VECTORS).mkdir()
        result.size, result.checksum = write_shard_file(
            Path(scratch), task.rel, block, task.rows_per_shard
        )
        del block
        upload_file(Path(scratch) / task.rel, task.upload, task.rel,
                    storage_options=task.storage_options)
    return result


def checker(task: ShardTask) -> Callable[[str, Any], Any]:
    """What checks each value the loader returns for ``task``, as ``check(key, value)``: a
    record against the task's schema, else an item against its dtype and shape."""
    schema = task.schema
    if schema is not None:
        return record_checker(schema, task.names)
    dtype = np.dtype(task.dtype)
    return lambda key, value: check_item(value, dtype, task.item_shape)


def compute(
    task: ShardTask,
    fn: Loader | BatchStage,
    check: Callable[[str, Any], Any],
    keep: Callable[[int, Any], None],
    result: ShardResult,
) -> None:
    """Compute every row of ``task`` and hand each value, checked by ``check(key, value)``,
    to ``keep(row, value)``, in row order; note each row's source identity (taken before
    it is read) and each failure in ``result``.

    ``fn`` is a loader of one key, or the stage of a batched build: the keys not
    computed already go to a device worker in batches.
    """
    # every source's identity first, before any is read (in one tight loop of stats); a
    # content hash just before its read, while the source is in the page cache
    ahead = isinstance(fn, BatchStage) or task.identity != "content"
    identities = [task.computed[i][1] if i in task.computed else
                  _identity(task, i, key) if ahead else None for i, key in enumerate(task.keys)]
    batched: dict[int, Row] = {}
    if isinstance(fn, BatchStage):
        todo = [i for i in range(len(task.keys)) if i not in task.computed]
        rows = fn.rows([task.keys[i] for i in todo], task.k, check, task.names)
        batched = dict(zip(todo, rows, strict=True))
    for i, key in enumerate(task.keys):
        done = task.computed.get(i)
        size, mtime, digest = identities[i] or _identity(task, i, key)
        result.source_size.append(size)
        result.source_mtime_ns.append(mtime)
        result.source_hash.append(digest)
        try:
            if done is not None:
                row = done[0]
            elif isinstance(fn, BatchStage):
                row = batched[i]
            else:
                row = check(key, fn(key))
            if isinstance(row, Failure):
                result.failures.append((i, row.reason, row.frames))
                continue
            if size < 0 and task.identity == "stat":
                raise NotAFileError(key)
        except Exception as exc:  # every failure is reported, none stops the build
            result.failures.append((i, f"{type(exc).__name__}: {exc}", loader_frames(exc)))
            continue
        keep(i, row)


class NotAFileError(ValueError):
    """A key that is not a file was loaded under ``identity="stat"``."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"{key!r} cannot be stat'ed (no such file): its size and mtime, which tell when its "
            "value is stale, are unknown; for keys that are not files pass identity='none' (never "
            "stale), or identity=<a function of the keys giving version tokens (uint64)>"
        )


def source_identity(key: str, check: SourceCheck, token: int | None = None) -> SourceStat:
    """What is recorded about ``key``'s source under ``check`` (its version ``token`` under
    ``"token"``), taken before the source is read (a source rewritten while it is loaded is
    stale next time)."""
    if check == "none":
        return -1, -1, 0
    if check == "token":
        assert token is not None
        return -1, int(np.uint64(token).view(np.int64)), 0
    return identify(key, content=check == "content")


def _identity(task: ShardTask, i: int, key: str) -> SourceStat:
    """The :func:`source_identity` of row ``i`` of ``task``."""
    return source_identity(key, task.identity, None if task.tokens is None else task.tokens[i])


def run_path(root: Path, name: str, k: int) -> Path:
    """Where the shard task ``k`` of a build in ``root`` leaves ragged field ``name``'s values."""
    return root / RUNS / name / str(k)


def _run_records(task: ShardTask, fn: Loader | BatchStage, schema: Schema) -> ShardResult:
    """Load and check every record of one shard; write its fixed shards and ragged runs."""
    result = ShardResult(task.rel)
    m = len(task.keys)
    fixed = {f.name: np.zeros((m, *f.field.inner), np.dtype(f.dtype)) for f in task.layouts}
    ragged: dict[str, list[npt.NDArray[Any]]] = {
        name: [] for name, f in schema if not isinstance(f, Fixed)
    }

    def keep(i: int, record: Any, fixed: dict[str, npt.NDArray[Any]] = fixed,
             ragged: dict[str, list[npt.NDArray[Any]]] = ragged) -> None:
        for name, block in fixed.items():
            block[i] = record[name]
        for name, values in ragged.items():  # a copy: a loader may refill one buffer
            values.append(np.array(record[name]))

    compute(task, fn, checker(task), keep, result)
    if result.failures and not task.write_on_failure:
        return result
    if task.upload is None:
        _write_records(task, Path(task.root), fixed, ragged, schema, result, task.trust)
        return result
    with tempfile.TemporaryDirectory(prefix="tsc-shard-") as scratch:
        root = Path(scratch)
        for layout in task.layouts:
            (root / layout.path).mkdir(parents=True)
        for name in ragged:
            run_path(root, name, task.k).parent.mkdir(parents=True)
        _write_records(task, root, fixed, ragged, schema, result, EXPLICIT)
        del fixed, ragged
        for rel in result.files:
            upload_file(root / rel, task.upload, rel, storage_options=task.storage_options)
        for name in result.run_files:
            rel = run_path(Path(), name, task.k).as_posix()
            upload_file(root / rel, task.upload, rel, storage_options=task.storage_options)
    return result


def _write_records(
    task: ShardTask,
    root: Path,
    fixed: dict[str, npt.NDArray[Any]],
    ragged: dict[str, list[npt.NDArray[Any]]],
    schema: Schema,
    result: ShardResult,
    trust: Trust,
) -> None:
    """Write the fixed shards and ragged runs of one task into ``root``; note them in ``result``."""
    for layout in task.layouts:
        rel = layout.chunk_key(task.k)
        result.files[rel] = write_shard_file(root, rel, fixed[layout.name],
                                             layout.rows_per_shard, trust)
    for name, f in schema:
        if name not in ragged:
            continue
        values, lengths, shapes = ragged_values(f, ragged[name])
        data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
        result.run_files[name] = write_replace(
            run_path(root, name, task.k), [data.reshape(-1).view(np.uint8).data], trust=trust,
            sync=False)
        result.runs[name] = (lengths.tolist(), None if shapes is None else shapes.tolist())
