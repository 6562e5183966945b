"""Compaction: merge several parts of a namespace into one new part.

Vectors are copied from the mapped parts, never recomputed, and every
entry keeps the source identity (size, mtime, content hash) recorded when it
was computed, so compaction never makes a stale entry look fresh. The merged
part is an ordinary store published with one rename; the parts it replaces
stay on disk until housekeeping removes them, so readers that map them are
never disturbed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..format.hashes import write_hashes
from ..format.metadata import VECTORS
from ..format.spec import StoreSpec
from ..fs.temp import remove_tree
from ..reader.store import CacheStore
from ..writer.assemble import finish_store, publish, rewrite_rows
from ..writer.build import default_workers, rows_per_shard, temp_dir

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


def write_merged(view: CacheStore, target: Path) -> int:
    """Write every live entry of ``view`` as one new store at ``target``; return its size.

    Parameters
    ----------
    view
        A store over the parts to merge (later parts override earlier ones).
    target
        The new part directory; must not exist.
    """
    keys = view.paths
    n = len(keys)
    base = view.spec
    recorded = view.source_identity(np.arange(n, dtype=np.int64), content_hash=True)
    spec = StoreSpec(
        n=n,
        item_shape=base.item_shape,
        dtype=base.dtype,
        loader_id=base.loader_id,
        loader_params=base.loader_params,
        rows_per_shard=rows_per_shard(n, base.item_nbytes, default_workers()),
        created_unix=time.time(),
    )
    tmp = temp_dir(target)
    tmp.mkdir()
    try:
        (tmp / VECTORS).mkdir()
        files = rewrite_rows(tmp, spec, view.take)
        meta = finish_store(
            tmp, spec, files, keys=keys, sizes=recorded.size, mtimes=recorded.mtime_ns
        )
        publish(tmp, target, meta, overwrite=False)
    except BaseException:
        remove_tree(tmp)
        raise
    hashes = recorded.content_hash
    if hashes is not None and np.any(hashes != 0):
        write_hashes(target, hashes)
    return n
