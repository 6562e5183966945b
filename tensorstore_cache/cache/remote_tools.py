""":func:`~tensorstore_cache.gc` and :func:`~tensorstore_cache.list_caches` on a remote prefix
shared by ``cached(remote=...)`` (see :mod:`tensorstore_cache.remote.survey`)."""

from __future__ import annotations

import os
from typing import Any

from ..remote import RemoteCacheInfo, Removed, collect_remote, objects_at, survey_prefix

__all__ = ["RemoteCacheInfo", "gc_remote", "list_remote"]


def list_remote(
    remote: str | os.PathLike[str], storage_options: dict[str, Any] | None
) -> list[RemoteCacheInfo]:
    """Every namespace under the prefix ``remote``, by name."""
    return survey_prefix(objects_at(os.fspath(remote), storage_options))


def gc_remote(
    remote: str | os.PathLike[str],
    storage_options: dict[str, Any] | None,
    older_than: float | None,
    *,
    max_bytes: int | None,
    dry_run: bool,
) -> list[Removed]:
    """Delete what no reader of the prefix ``remote`` needs, out of use for ``older_than``.

    Raises
    ------
    ValueError
        Without ``older_than`` (nothing of a remote goes without an age), or with
        ``max_bytes`` (a remote is not collected by size).
    """
    if older_than is None:
        raise ValueError("gc(remote=...) needs older_than=: a part goes only once it has been "
                         "out of use that long (e.g. older_than=timedelta(days=7))")
    if max_bytes is not None:
        raise ValueError("gc(remote=...) collects by age only (older_than=); max_bytes "
                         "bounds a cache directory")
    return collect_remote(objects_at(os.fspath(remote), storage_options), older_than,
                          dry_run=dry_run)
