"""Copying the store at an fsspec URL into the node-local cache, once per node and version.

A memory map needs a local file, so a remote store is first copied into a
node-local cache directory and mapped from there::

    <cache_dir>/remote/<name>-<hash of URL>/<XXH3-128 of the remote group zarr.json>/

The copy is made once per node and per version of the store:

1. read the remote group ``zarr.json`` (one small request) and hash it; if
   that version is already here, map it: no other request is made;
2. otherwise take an exclusive ``flock`` on ``<version>.lock`` (processes of
   the node asking at the same moment wait here), look again, and download
   into a hidden sibling directory: the group and array metadata first, then
   every file the group's ``files`` list names, each checked against its
   recorded size and XXH3-128 and fsynced;
3. publish the directory with one ``rename``.

A reader never maps a partial copy, a damaged download is never published,
and a store changed remotely (a different group ``zarr.json``) gets a new
local copy. Copies are immutable.

Uploading a store is :mod:`tensorstore_cache.remote.upload`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..format.metadata import GROUP, INDEX_ARRAYS, VECTORS, GroupMetadata
from ..fs.durable import file_digest, fsync_dir, write_bytes_durable
from ..fs.locks import BuildLock
from ..fs.temp import collect_temp_siblings, remove_tree, temp_sibling
from .urls import filesystem, node_dir, version_name

__all__ = ["fetch_store"]

_ARRAY_DIRS = (VECTORS, *INDEX_ARRAYS)


def _read_group(fs: Any, root: str, url: str) -> bytes:
    """Read the remote group ``zarr.json`` with one request, refusing oversized ones."""
    try:
        raw = fs.cat_file(f"{root}/{GROUP}", start=0, end=config.MAX_GROUP_JSON + 1)
    except FileNotFoundError:
        raise StoreNotFoundError(
            f"no store at {url!r} (no {GROUP}); build one with "
            "tensorstore_cache.build_store(paths, url) (or check the URL)"
        ) from None
    if len(raw) > config.MAX_GROUP_JSON:
        raise CorruptStoreError(
            f"{url}/{GROUP} is larger than the {config.MAX_GROUP_JSON} bytes allowed", url
        )
    return bytes(raw)


def _check_copy(path: Path, size: int, digest: str) -> str | None:
    """Check one downloaded file against its recorded size and hash, fsync it; ``None`` if good."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"not downloaded ({exc})"
    try:
        found = os.fstat(fd).st_size
        if found != size:
            return f"{found} bytes, the store records {size}"
        if file_digest(fd) != (size, digest):
            return "content differs from its recorded XXH3-128"
        os.fsync(fd)
    finally:
        os.close(fd)
    return None


class _ChangedError(Exception):
    """Downloaded files do not match the group metadata they were fetched for."""

    def __init__(self, bad: list[tuple[str, str]]) -> None:
        super().__init__(bad)
        self.bad = bad


def _download(fs: Any, root: str, raw: bytes, tmp: Path) -> int:
    """Copy the store at ``root`` (whose group zarr.json is ``raw``) into ``tmp``; return bytes."""
    write_bytes_durable(tmp / GROUP, raw)
    # array metadata first (small, fixed names): GroupMetadata.read then validates everything
    meta = [f"{name}/{GROUP}" for name in _ARRAY_DIRS]
    for rel in meta:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    _get(fs, root, tmp, meta)  # read_json caps their size; checksums are checked below
    try:
        files = GroupMetadata.read(tmp).files
    except (CorruptStoreError, StoreNotFoundError) as exc:  # e.g. replaced while we read it
        raise _ChangedError([("metadata", str(exc))]) from None
    data = sorted(set(files) - set(meta))
    for rel in data:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    _get(fs, root, tmp, data)
    bad = [(rel, why) for rel in sorted(files) if (why := _check_copy(tmp / rel, *files[rel]))]
    if bad:
        raise _ChangedError(bad)
    dirs = {tmp}
    for rel in files:
        parts = rel.split("/")[:-1]
        dirs.update(tmp.joinpath(*parts[:i]) for i in range(1, len(parts) + 1))
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):  # deepest first
        fsync_dir(d)
    return sum(size for size, _ in files.values())


def _get(fs: Any, root: str, tmp: Path, rels: list[str]) -> None:
    if not rels:
        return
    remote = [f"{root}/{rel}" for rel in rels]
    local = [str(tmp / rel) for rel in rels]
    try:
        fs.get(remote, local)  # concurrent requests on async filesystems (s3fs, gcsfs)
    except FileNotFoundError:
        for r, lo in zip(remote, local, strict=True):  # fetch what exists; the check names the rest
            try:
                fs.get_file(r, lo)
            except FileNotFoundError:
                continue


def _collect_fetch_debris(base: Path, version: str) -> None:
    """Remove download directories of ``version`` left by processes that died.

    A directory of a process of this host that no longer exists goes at
    once; one of another host (a shared cache directory) once a day old.
    """
    collect_temp_siblings(base, f".{version}{config.FETCH_MARK}", 24 * 3600.0)


def fetch_store(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    lock_timeout: float | None = None,
    attempts: int = 3,
) -> Path:
    """Make sure the current version of the store at ``url`` is copied locally; return the copy.

    Parameters
    ----------
    url
        An fsspec URL of a store directory (``s3://bucket/covers.tsc``).
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``); the copy goes under ``remote/``.
        Use a node-local disk.
    storage_options
        Passed to the fsspec filesystem (credentials, ``endpoint_url``, ...).
    lock_timeout
        Seconds to wait for another process of this node that is copying the
        same version (default: as long as it takes; a dead copier releases
        its lock at once).
    attempts
        How many times to start over when the remote store changes during
        the copy.

    Returns
    -------
    pathlib.Path
        The local, complete, verified copy (never modified afterwards).

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``url``.
    CorruptStoreError
        If the remote files do not match their recorded sizes and checksums
        (the store is damaged, or is being overwritten right now).
    StoreLockedError
        If ``lock_timeout`` passed while another process was copying.
    """
    fs, root = filesystem(url, storage_options)
    base = node_dir(url, cache_dir)
    last: list[tuple[str, str]] = []
    for attempt in range(max(1, attempts)):
        raw = _read_group(fs, root, url)
        version = version_name(raw)
        local = base / version
        if local.is_dir():
            return local
        base.mkdir(parents=True, exist_ok=True)
        with BuildLock(base / f"{version}.lock", what="fetch") as lock:
            lock.acquire(timeout=lock_timeout)
            if local.is_dir():  # another process of this node copied it meanwhile
                return local
            _collect_fetch_debris(base, version)
            tmp = _fetch_tmp(local)
            tmp.mkdir()
            try:
                _download(fs, root, raw, tmp)
                try:
                    tmp.rename(local)
                except OSError:
                    if not local.is_dir():
                        raise
                    remove_tree(tmp)  # published meanwhile by a process that did not lock
                    return local
                fsync_dir(base)
                return local
            except _ChangedError as changed:
                remove_tree(tmp)
                last = changed.bad
            except BaseException:
                remove_tree(tmp)
                raise
        if attempt + 1 < attempts:
            time.sleep(0.5 * 2**attempt)  # the store may be being replaced: look again
    shown = "; ".join(f"{rel}: {why}" for rel, why in last[:5])
    raise CorruptStoreError(
        f"the files of {url!r} do not match its {GROUP} after {attempts} attempts ({shown}"
        f"{' ...' if len(last) > 5 else ''}); the remote store is damaged or is being "
        "overwritten - rebuild or re-upload it, or retry when the upload has finished",
        url,
    )


def _fetch_tmp(local: Path) -> Path:
    return temp_sibling(local, config.FETCH_MARK)
