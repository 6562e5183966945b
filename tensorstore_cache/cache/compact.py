"""Compaction: merge several parts of a namespace into one new part.

Vectors (and every field of records: fixed ones shard by shard, ragged ones
by copying their values and rebasing their offsets) are copied from the
mapped parts, never recomputed, and every
entry keeps the source identity (size, mtime, content hash) recorded when it
was computed, so compaction never makes a stale entry look fresh. The merged
part is an ordinary store published with one rename; the parts it replaces
stay on disk until housekeeping removes them, so readers that map them are
never disturbed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import config
from ..format import FIELDS, VECTORS, Fixed, StoreSpec, write_hashes
from ..fs import Trust, make_dir, remove_tree
from ..reader import CacheStore, view_of
from ..writer import (
    RaggedWriter,
    default_workers,
    finish_store,
    publish,
    record_spec,
    rewrite_rows,
    rows_per_shard,
    temp_dir,
)

__all__ = ["MAX_PARTS", "MAX_WASTE", "merge_start", "write_merged"]

#: More live parts than this triggers a merge.
MAX_PARTS = 8
#: More than this fraction of overridden (dead) rows triggers a full merge.
MAX_WASTE = 0.25


def merge_start(part_rows: Sequence[int], dead_rows: int) -> int | None:
    """Return the index of the first part of the suffix to merge, or None if merging does not pay.

    Dead rows above :data:`MAX_WASTE` of all rows merge everything (the only
    way to drop them). More than :data:`MAX_PARTS` parts merge the parts that
    follow the biggest one (usually the small increments after a large first
    build), or everything if that would not bring the count down enough.
    """
    total = sum(part_rows)
    if len(part_rows) > 1 and total and dead_rows / total > MAX_WASTE:
        return 0
    if len(part_rows) <= MAX_PARTS:
        return None
    big = max(range(len(part_rows)), key=lambda i: (part_rows[i], -i))
    start = big + 1
    if len(part_rows) - start >= 2 and start + 1 <= MAX_PARTS:
        return start
    return 0


def write_merged(view: CacheStore, target: Path, *, trust: Trust) -> int:
    """Write every live entry of ``view`` as one new store at ``target``; return its size.

    Parameters
    ----------
    view
        A store over the parts to merge (later parts override earlier ones).
    target
        The new part directory; must not exist.
    trust
        The cache's policy: the modes of what is created.
    """
    keys = view.paths
    n = len(keys)
    base = view.spec
    recorded = view_of(view).source_identity(np.arange(n, dtype=np.int64), content_hash=True)
    # the kinds of the live rows only: a part whose rows were all recomputed since (under
    # another kind, say) must not make the merge mixed, or every later check finds it stale
    live = recorded.recorded
    kinds = set(np.unique(live).tolist()) if live is not None and n else {base.identity}
    mixed = len(kinds) > 1
    # one kind per part: rows recorded otherwise (size -1) are stale once under that kind
    identity = "stat" if mixed else kinds.pop()
    if base.records:
        spec = record_spec(n, base.schema, loader_id=base.loader_id, params=base.loader_params,
                           workers=default_workers(), shard_bytes=config.SHARD_BYTES)
    else:
        spec = StoreSpec(
            n=n,
            item_shape=base.item_shape,
            dtype=base.dtype,
            loader_id=base.loader_id,
            loader_params=base.loader_params,
            rows_per_shard=rows_per_shard(n, base.item_nbytes, default_workers()),
            created_unix=time.time(),
        )
    spec = dataclasses.replace(spec, identity=identity)
    tmp = temp_dir(target)
    make_dir(tmp, trust, exist_ok=False)
    try:
        if base.records:
            spec, files = _copy_fields(tmp, spec, view, trust)
        else:
            make_dir(tmp / VECTORS, trust, exist_ok=False)
            files = rewrite_rows(tmp, spec.layouts()[0], view.take, trust)
        sizes = recorded.size.copy()
        if mixed and recorded.recorded is not None:
            sizes[recorded.recorded != "stat"] = -1
        meta = finish_store(
            tmp, spec, files, keys=keys, sizes=sizes, mtimes=recorded.mtime_ns,
            trust=trust,
        )
        publish(tmp, target, meta, overwrite=False, trust=trust)
    except BaseException:
        remove_tree(tmp)
        raise
    hashes = recorded.content_hash
    if hashes is not None and np.any(hashes != 0):
        write_hashes(target, hashes, trust=trust)
    return n


#: Rows of a ragged field copied at a time by a merge (bounds its memory).
_COPY_ROWS = 4096


def _copy_fields(
    tmp: Path, spec: StoreSpec, view: CacheStore, trust: Trust
) -> tuple[StoreSpec, dict[str, tuple[int, str]]]:
    """Write every field of ``view``'s live rows into ``tmp``: fixed fields shard by shard,
    ragged ones by copying their values and rebasing their offsets (nothing recomputed)."""
    n = spec.n
    make_dir(tmp / FIELDS, trust, exist_ok=False)
    files: dict[str, tuple[int, str]] = {}
    layouts = []
    for layout in spec.fields:
        if isinstance(layout.field, Fixed):
            make_dir(tmp / layout.path, trust, exist_ok=False)
            files.update(rewrite_rows(tmp, layout, view.field(layout.name).take, trust))
            layouts.append(layout)
            continue
        total = int(view_of(view).value_lengths(layout.name, np.arange(n, dtype=np.int64)).sum())
        writer = RaggedWriter(tmp, layout.name, layout.field, n=n, total=total, trust=trust)
        for start in range(0, n, _COPY_ROWS):
            rows = np.arange(start, min(start + _COPY_ROWS, n), dtype=np.int64)
            values, offsets, shapes = view_of(view).gather_values(layout.name, rows)
            writer.append(values, np.diff(offsets), shapes)
        final, written = writer.finish()
        layouts.append(final)
        files.update(written)
    return dataclasses.replace(spec, fields=tuple(layouts)), files
