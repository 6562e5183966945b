"""Merging a store's segments into one new store: the writer's compaction verb.

Vectors (and every field of records: fixed ones shard by shard, ragged ones
by copying their values and rebasing their offsets) are copied from the
mapped segments, never recomputed, and every entry keeps the source identity
(size, mtime, content hash) recorded when it was computed, so a merge never
makes a stale entry look fresh. The merged store is an ordinary store
published with one rename.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from .. import config
from ..format import FIELDS, VECTORS, Fixed, StoreSpec, write_hashes
from ..fs import Trust, make_dir, remove_tree
from ..reader import CacheStore, view_of
from .assemble import finish_store, publish, rewrite_rows
from .builder import default_workers, temp_dir
from .fields import record_spec
from .layout import rows_per_shard
from .ragged import RaggedWriter

__all__ = ["write_merged"]


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
