"""Shard tasks: decode the sources of one shard and write it, in whatever process runs it.

A :class:`ShardTask` is everything needed to produce one shard file and is
picklable, so any :class:`concurrent.futures.Executor` can run it (a Dask
client's executor for a cluster); :mod:`.schedule` runs a build's tasks.
A task of a build to a URL writes its shard to a local temporary file and
uploads it from where it runs, so no directory is shared between the
builder and the workers.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format.metadata import VECTORS
from ..fs.trust import EXPLICIT, Trust
from ..loaders import Loader
from ..remote.upload import upload_file
from .assemble import write_shard_file

__all__ = ["ShardResult", "ShardTask", "load_item", "run_shard"]

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


@dataclass(slots=True, kw_only=True)
class ShardTask:
    """Everything a worker needs to produce one shard (picklable).

    ``loader`` is None in the tasks sent to a :class:`~.pool.BuildPool`,
    whose workers received the loader when they started. ``computed`` holds
    items computed already, by row in the shard (the one that told the
    builder the item shape). ``trust`` gives the shard's directories and file
    the modes of the cache (or store) being built, in whatever process writes it.
    With ``upload`` (the store's URL) the shard is written to a local temporary
    file and uploaded there, ``root`` is not written; ``storage_options`` are
    the URL's filesystem options.
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
    trust: Trust = EXPLICIT
    upload: str | None = None
    storage_options: dict[str, Any] | None = None


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
