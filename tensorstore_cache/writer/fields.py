"""Building a store of records: its layout, and the fields assembled after the shard tasks.

The shard tasks of a store of records cover the same rows of every fixed
field: task ``k`` writes shard ``k`` of each, so every field has the same
``rows_per_shard`` (:func:`~.layout.rows_per_shard`, chosen so that each
field's shards are whole pages when there are enough rows). A ragged field's
chunks cannot be cut before every row's length is known, so each task leaves
its rows' values as a run (``runs/<field>/<k>``); once every task is done, the
builder streams the runs, in row order, into the field's chunk files
(:class:`~.ragged.RaggedWriter`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import FIELDS, RECORDS_VERSION, FieldLayout, Fixed, StoreSpec
from ..fs import Trust, discard_tree, io_step, make_dir
from .assemble import Files, rewrite_rows
from .layout import rows_per_shard
from .ragged import RaggedWriter
from .records import Schema
from .tasks import RUNS, ShardResult, run_path

__all__ = ["assemble_fields", "drop_rows", "prepare_fields", "record_spec"]


def record_spec(
    n: int, schema: Schema, *, loader_id: str, params: dict[str, Any], workers: int,
    shard_bytes: int, batch: int = 1,
) -> StoreSpec:
    """The spec of a store of ``n`` records before its build (ragged fields not laid out yet)."""
    fixed = [f for _name, f in schema if isinstance(f, Fixed)]
    s = rows_per_shard(n, [f.nbytes for f in fixed], workers, shard_bytes, batch)
    layouts = tuple(
        FieldLayout(name, f, n, rows_per_shard=s, path=f"{FIELDS}/{name}")
        for name, f in schema
    )
    return StoreSpec(
        n=n, item_shape=None, dtype=None, loader_id=loader_id, loader_params=params,
        format_version=RECORDS_VERSION, rows_per_shard=s, created_unix=time.time(),
        fields=layouts,
    )


def prepare_fields(tmp: Path, spec: StoreSpec, trust: Trust) -> None:
    """Create the directories the shard tasks of a store of records write into."""
    make_dir(tmp / FIELDS, trust, exist_ok=False)
    make_dir(tmp / RUNS, trust, exist_ok=False)
    for layout in spec.fields:
        if isinstance(layout.field, Fixed):
            make_dir(tmp / layout.path, trust, exist_ok=False)
        else:
            make_dir(tmp / RUNS / layout.name, trust, exist_ok=False)


def assemble_fields(
    tmp: Path,
    spec: StoreSpec,
    results: Sequence[ShardResult],
    files: Files,
    trust: Trust,
    shard_bytes: int | None = None,
) -> tuple[StoreSpec, Files]:
    """Write the ragged fields from the runs of ``results`` (task order); remove the runs.

    ``spec.n`` counts the rows kept (the runs hold only those); ``files``
    holds the fixed fields' shards. A chunk of values holds about
    ``shard_bytes`` (the build's target size of a data file; at most
    :data:`~.ragged.RAGGED_CHUNK_BYTES`, the default), so that a store read
    on demand fetches ragged values in pieces no larger than its shards.
    Returns the final spec and every file.
    """
    layouts = []
    every = dict(files)
    for layout in spec.fields:
        if isinstance(layout.field, Fixed):
            layouts.append(layout)
            continue
        total = sum(int(np.sum(r.runs[layout.name][0], dtype=np.int64)) for r in results)
        writer = RaggedWriter(tmp, layout.name, layout.field, n=spec.n, total=total, trust=trust,
                              target_bytes=shard_bytes)
        inner = layout.field.inner
        dtype = np.dtype(layout.dtype).newbyteorder("<")
        for k, result in enumerate(results):
            lengths, shapes = result.runs[layout.name]
            if not lengths:
                continue
            raw = run_path(tmp, layout.name, k).read_bytes()
            values = np.frombuffer(raw, dtype).reshape(-1, *inner) if inner else np.frombuffer(
                raw, dtype)
            writer.append(values, np.asarray(lengths, np.int64),
                          None if shapes is None else np.asarray(shapes, np.int64))
        final, written = writer.finish()
        layouts.append(final)
        every.update(written)
    discard_tree(tmp / RUNS, strict=True)
    return _replace_fields(spec, tuple(layouts)), every


def _replace_fields(spec: StoreSpec, fields: tuple[FieldLayout, ...]) -> StoreSpec:
    return dataclasses.replace(spec, fields=fields)


def drop_rows(
    tmp: Path,
    spec: StoreSpec,
    counts: list[int],
    keep: npt.NDArray[np.bool_],
    trust: Trust,
) -> tuple[StoreSpec, Files]:
    """Rewrite every fixed field's shards without the rows not kept (``on_error="skip"``).

    ``counts`` are the rows each shard task wrote; returns the spec of the
    rows kept (ragged fields keep their placeholders) and the new shards.
    """
    kept = np.flatnonzero(keep)
    n = len(kept)
    s = spec.rows_per_shard
    layouts = tuple(
        FieldLayout(f.name, f.field, n, rows_per_shard=s, path=f.path) for f in spec.layouts()
    )
    new_spec = dataclasses.replace(_replace_fields(spec, layouts) if spec.records else spec, n=n)
    files: Files = {}
    staging = tmp / "rewrite"
    make_dir(staging, trust, exist_ok=False)
    for old, new in zip(spec.layouts(), new_spec.layouts(), strict=True):
        if not isinstance(old.field, Fixed):
            continue
        read = _old_rows(tmp, old, counts, kept)
        target = staging
        for part in Path(new.path).parts:  # vectors, or fields/<name>
            target = target / part
            if not target.is_dir():
                make_dir(target, trust, exist_ok=False)
        files.update(rewrite_rows(staging, new, read, trust))
        discard_tree(tmp / old.path, strict=True)
        io_step("rename")
        target.rename(tmp / old.path)
    discard_tree(staging, strict=True)
    return new_spec, files


def _old_rows(
    tmp: Path, layout: FieldLayout, counts: list[int], kept: npt.NDArray[np.int64]
) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[Any]]:
    """Reads rows of the rewritten field from its shards as the tasks wrote them."""
    s = layout.rows_per_shard
    dtype = np.dtype(layout.dtype).newbyteorder("<")
    shape = layout.field.inner
    maps: dict[int, npt.NDArray[Any]] = {}

    def read(rows: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        block = np.empty((len(rows), *shape), dtype=dtype)
        for i, row in enumerate(kept[rows].tolist()):
            k = row // s
            if k not in maps:
                maps[k] = np.memmap(tmp / layout.chunk_key(k), dtype=dtype, mode="r",
                                    shape=(counts[k], *shape))
            block[i] = maps[k][row % s]
        return block

    return read
