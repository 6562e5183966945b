"""Uploading a local store directory to an fsspec URL, group ``zarr.json`` last.

Object stores (S3, GCS, Azure) make each object write atomic and, today,
strongly consistent: a reader sees a whole old or a whole new object,
never a torn one. They have no atomic rename and no multi-object
transaction, so the group ``zarr.json`` is the commit record: it is
written after every other file, and readers download it first and check
every other file against the sizes and checksums it lists. A reader that
starts before the upload ends finds no store (or, when overwriting, the
old ``zarr.json`` with files that no longer match it, detected and
retried). With ``overwrite=True`` the old ``zarr.json`` is deleted
first and stale files of the old store are deleted last. Two builders
uploading to the same URL at once are not excluded (last ``zarr.json``
wins); publish new versions under new URLs where that matters.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import config
from ..errors import StoreExistsError
from ..format.metadata import GROUP, INDEX_ARRAYS, VECTORS, GroupMetadata
from ..fs.durable import fsync_dir
from ..fs.temp import temp_sibling
from .urls import filesystem, node_dir, version_name

__all__ = ["check_target", "staging_dir", "upload_store"]

_ARRAY_DIRS = (VECTORS, *INDEX_ARRAYS)


def check_target(url: str, *, overwrite: bool, storage_options: Mapping[str, Any] | None) -> None:
    """Refuse to build for ``url`` if a store is there and ``overwrite`` is false.

    Raises
    ------
    StoreExistsError
        If ``url`` holds a store and ``overwrite`` is false.
    """
    fs, root = filesystem(url, storage_options)
    if not overwrite and fs.exists(f"{root}/{GROUP}"):
        raise StoreExistsError(
            f"{url!r} already holds a store; pass overwrite=True to replace it, or open it "
            "with tensorstore_cache.open_store"
        )


def staging_dir(url: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Create and return a fresh directory to build a store for ``url`` in, in the node cache.

    It lies on the filesystem of the node-local copies, so that the built
    store becomes this node's copy with one rename (:func:`upload_store`).
    """
    base = node_dir(url, cache_dir)
    base.mkdir(parents=True, exist_ok=True)
    staging = temp_sibling(base / "upload", config.FETCH_MARK)
    staging.mkdir()
    return staging


def upload_store(
    local: Path,
    url: str,
    *,
    overwrite: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Upload the store directory ``local`` to ``url``; keep ``local`` as this node's copy.

    Data files first, then the array metadata, the group ``zarr.json`` last.
    Afterwards ``local`` is moved into the node-local cache as the copy of
    the uploaded version, so opening ``url`` on this node downloads nothing;
    ``local`` must lie on the same filesystem as ``node_dir(url, cache_dir)``.
    """
    fs, root = filesystem(url, storage_options)
    raw = _upload(local, fs, root, overwrite)
    base = node_dir(url, cache_dir)
    base.mkdir(parents=True, exist_ok=True)
    try:
        local.rename(base / version_name(raw))
        fsync_dir(base)
    except OSError:
        pass  # this version is already here (identical bytes, by its checksums)


def _upload(local: Path, fs: Any, root: str, overwrite: bool) -> bytes:
    """Upload the store at ``local`` to ``root``: data, then array metadata, group ``zarr.json`` last."""
    raw = (local / GROUP).read_bytes()
    files = sorted(GroupMetadata.read(local).files)
    if overwrite:
        with contextlib.suppress(FileNotFoundError):  # readers now find no store, not a mixed one
            fs.rm_file(f"{root}/{GROUP}")
    data = [rel for rel in files if not rel.endswith(GROUP)]
    meta = [rel for rel in files if rel.endswith(GROUP)]
    for part in (data, meta):
        if part:
            fs.put([str(local / rel) for rel in part], [f"{root}/{rel}" for rel in part])
    fs.pipe_file(f"{root}/{GROUP}", raw)
    if overwrite:
        keep = set(files)
        stale = []
        for name in _ARRAY_DIRS:
            try:
                found = fs.find(f"{root}/{name}")
            except FileNotFoundError:
                continue
            prefix = root.strip("/") + "/"
            for path in found:
                rel = str(path).strip("/")
                if rel.startswith(prefix) and rel[len(prefix) :] not in keep:
                    stale.append(f"{root}/{rel[len(prefix):]}")
        if stale:
            fs.rm(stale)
    return raw
