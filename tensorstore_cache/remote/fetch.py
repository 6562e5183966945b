"""Opening the store at an fsspec URL in the node cache: its metadata and index, once per version.

A memory map needs a local file, so a remote store is read through a
node-local cache directory::

    <cache_dir>/remote/<name>-<hash of URL>/<XXH3-128 of the remote group zarr.json>/

Opening fetches the metadata and the index only, once per node and version:

1. read the remote group ``zarr.json`` (one small request) and hash it; if
   that version is already here, open it: no other request is made;
2. otherwise take an exclusive ``flock`` on ``<version>.lock`` (processes of
   the node asking at the same moment wait here), look again, and download
   into a hidden sibling directory: the group and array metadata first, then
   the index files the group's ``files`` list names, each checked against
   its recorded size and XXH3-128 and fsynced;
3. publish the directory with one ``rename``.

Shards are fetched into that directory when first read
(:mod:`tensorstore_cache.remote.shards`). A reader never sees a partial
file, a damaged download is never published, and a store changed remotely
(a different group ``zarr.json``) gets a new version directory.

The node cache obeys the rules of the cache directory it lies in (see
:mod:`tensorstore_cache.fs.trust`): every directory on the way and the copy
itself are checked before use (a copy planted by someone else is refused, not
read), and what a download creates gets the cache's modes (private
``0o700``/``0o600``, or the shared group's) before it is published.

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
from ..fs.trust import Trust, apply_modes, make_dir, open_dir
from .urls import filesystem, node_dir, open_url_dir, version_name

__all__ = ["fetch_store", "is_shard", "read_group"]

#: Reads back a download in progress (this process's own directory): checks come later.
_QUIET = Trust.explicit(warn=False)

_ARRAY_DIRS = (VECTORS, *INDEX_ARRAYS)


def read_group(fs: Any, root: str, url: str) -> bytes:
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


def _check_copy(path: Path, size: int, digest: str, trust: Trust) -> str | None:
    """Check one downloaded file against its recorded size and hash, give it the cache's
    modes, fsync it; ``None`` if good."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"not downloaded ({exc})"
    try:
        apply_modes(fd, trust, trust.file_mode)
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


def _make_parents(tmp: Path, rel: str, trust: Trust) -> None:
    """Create the directories of ``rel`` below ``tmp``, with the cache's modes."""
    d = tmp
    for part in rel.split("/")[:-1]:
        d = d / part
        make_dir(d, trust)


def _download(fs: Any, root: str, raw: bytes, tmp: Path, trust: Trust) -> int:
    """Copy the store at ``root`` (whose group zarr.json is ``raw``) into ``tmp``; return bytes."""
    write_bytes_durable(tmp / GROUP, raw, trust=trust)
    # array metadata first (small, fixed names): GroupMetadata.read then validates everything
    meta = [f"{name}/{GROUP}" for name in _ARRAY_DIRS]
    for rel in meta:
        _make_parents(tmp, rel, trust)
    _get(fs, root, tmp, meta)  # read_json caps their size; checksums are checked below
    try:
        files = GroupMetadata.read(tmp, trust=_QUIET).files
    except (CorruptStoreError, StoreNotFoundError) as exc:  # e.g. replaced while we read it
        raise _ChangedError([("metadata", str(exc))]) from None
    data = sorted(rel for rel in set(files) - set(meta) if not is_shard(rel))
    for rel in data:
        _make_parents(tmp, rel, trust)
    _get(fs, root, tmp, data)
    kept = [rel for rel in sorted(files) if not is_shard(rel)]
    bad = [(rel, why) for rel in kept if (why := _check_copy(tmp / rel, *files[rel], trust))]
    if bad:
        raise _ChangedError(bad)
    dirs = {tmp}
    for rel in kept:
        parts = rel.split("/")[:-1]
        dirs.update(tmp.joinpath(*parts[:i]) for i in range(1, len(parts) + 1))
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):  # deepest first
        fsync_dir(d)
    return sum(files[rel][0] for rel in kept)


def is_shard(rel: str) -> bool:
    """Whether ``rel`` names a shard file (fetched on demand, not with the index)."""
    return rel.startswith(f"{VECTORS}/c/")


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
    trust: Trust | None = None,
) -> Path:
    """Make sure the metadata and index of the current version of ``url`` are here; return them.

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
    trust
        The rules of the cache directory (default: the current user's private
        cache): checked on every directory on the way and on the copy, and
        the modes of what is created.

    Returns
    -------
    pathlib.Path
        The version directory: metadata and index verified, shards added as
        they are fetched (never modified otherwise).

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``url``.
    CorruptStoreError
        If the remote files do not match their recorded sizes and checksums
        (the store is damaged, or is being overwritten right now).
    StoreLockedError
        If ``lock_timeout`` passed while another process was copying.
    UntrustedCacheError
        If a directory on the way, or the copy, fails ``trust``.
    """
    trust = trust if trust is not None else Trust.private()
    fs, root = filesystem(url, storage_options)
    base = node_dir(url, cache_dir)
    last: list[tuple[str, str]] = []
    for attempt in range(max(1, attempts)):
        raw = read_group(fs, root, url)
        version = version_name(raw)
        local = base / version
        if _have(url, cache_dir, version, trust, create=True):
            return local
        with BuildLock(base / f"{version}.lock", what="fetch", trust=trust) as lock:
            lock.acquire(timeout=lock_timeout)
            if _have(url, cache_dir, version, trust):  # copied meanwhile by another process
                return local
            _collect_fetch_debris(base, version)
            tmp = _fetch_tmp(local)
            make_dir(tmp, trust, exist_ok=False)
            try:
                _download(fs, root, raw, tmp, trust)
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


def _have(
    url: str, cache_dir: str | os.PathLike[str] | None, version: str, trust: Trust,
    *, create: bool = False,
) -> bool:
    """Whether the copy of ``version`` is here: opened and checked, with every directory above it."""
    base = open_url_dir(url, cache_dir, trust, create=create)
    try:
        fd = open_dir(version, trust, dir_fd=base, shown=node_dir(url, cache_dir) / version)
    except (FileNotFoundError, NotADirectoryError):
        return False
    finally:
        os.close(base)
    os.close(fd)
    return True


def _fetch_tmp(local: Path) -> Path:
    return temp_sibling(local, config.FETCH_MARK)
