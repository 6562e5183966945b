"""Opening the store at an fsspec URL in the node cache: its metadata and index, once per version.

A memory map needs a local file, so a remote store is read through a
node-local cache directory::

    <cache_dir>/remote/<name>-<hash of URL>/<XXH3-128 of the remote group zarr.json>/

Opening fetches the metadata and the index only (and the offsets and shapes
of ragged fields), once per node and version:

1. read the remote group ``zarr.json`` (one small request) and hash it; if
   that version is already here, open it: no other request is made;
2. otherwise take an exclusive ``flock`` on ``<version>.lock`` (processes of
   the node asking at the same moment wait here), look again, and download
   into a hidden sibling directory: the group and array metadata first, then
   the files the group's ``files`` list names that are not data files
   (:func:`~tensorstore_cache.format.metadata.fetched_files`), each checked
   against its recorded size and XXH3-128 and fsynced;
3. publish the directory with one ``rename``.

A part of a cluster's namespace comes the same way from its bundle, one
object holding its metadata and index (:func:`install_bundle`, see
:mod:`tensorstore_cache.remote.bundle`); a part this node built moves into
the node cache whole (:func:`adopt_version`).

Data files (shards, chunks of ragged values) are fetched into that directory
when first read (:mod:`tensorstore_cache.remote.shards`). A reader never sees a partial
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

import functools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..format import GROUP, GroupMetadata, array_documents, fetched_files
from ..fs import (
    ExclusiveLock,
    Trust,
    apply_modes,
    collect_temps,
    create_file,
    disk_usage,
    file_digest,
    fsync_dir,
    make_dir,
    open_dir,
    read_json,
    remove_tree,
    temp_path,
    write_bytes_durable,
)
from .bundle import Bundle
from .node_cache import HOLDS_SUFFIX, NodeCache
from .urls import filesystem, node_dir, open_url_dir, version_name

__all__ = ["adopt_version", "fetch_store", "install_bundle", "read_group"]

#: Reads back a download in progress (this process's own directory): checks come later.
_QUIET = Trust.explicit(warn=False)

#: Copies of a version started over when the remote store changes during the copy.
_ATTEMPTS = 3


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


#: Writes the store files ``rels`` into a directory being filled.
Getter = Callable[[Path, list[str]], None]


def _download(get: Getter, raw: bytes, tmp: Path, *, trust: Trust) -> int:
    """Copy the store whose group zarr.json is ``raw`` into ``tmp``, its other files through
    ``get``; return the bytes kept.

    Raises
    ------
    _ChangedError
        If the files got do not match the group metadata.
    """
    write_bytes_durable(tmp / GROUP, raw, trust=trust)
    # array metadata first (small, named by the group): GroupMetadata.read then validates all
    try:
        doc = read_json(tmp / GROUP, max_bytes=config.MAX_GROUP_JSON, trust=_QUIET)
        group = GroupMetadata.from_json(doc, str(tmp / GROUP))
    except CorruptStoreError as exc:  # e.g. replaced while we read it
        raise _ChangedError([("metadata", str(exc))]) from None
    meta = [f"{d}/{GROUP}" for d in array_documents(group.spec, group.key_bytes_len)]
    for rel in meta:
        _make_parents(tmp, rel, trust)
    get(tmp, meta)  # read_json caps their size; checksums are checked below
    try:
        read = GroupMetadata.read(tmp, trust=_QUIET)
    except (CorruptStoreError, StoreNotFoundError) as exc:  # e.g. replaced while we read it
        raise _ChangedError([("metadata", str(exc))]) from None
    files = read.files
    fetched = set(fetched_files(read.spec))  # on demand, when first read
    data = sorted(rel for rel in set(files) - set(meta) if rel not in fetched)
    for rel in data:
        _make_parents(tmp, rel, trust)
    get(tmp, data)
    kept = [rel for rel in sorted(files) if rel not in fetched]
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
    collect_temps(base, 24 * 3600.0, target=version, kind="fetch")


def fetch_store(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    trust: Trust | None = None,
    url_dir_fd: int | None = None,
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
    trust
        The rules of the cache directory (default: the current user's private
        cache): checked on every directory on the way and on the copy, and
        the modes of what is created.
    url_dir_fd
        The checked descriptor of the URL's directory in the node cache
        (:func:`~tensorstore_cache.remote.urls.open_url_dir`), if the caller
        has opened it already (it stays open); else it is opened here.

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
    UntrustedCacheError
        If a directory on the way, or the copy, fails ``trust``.
    """
    trust = trust if trust is not None else Trust.private()
    fs, root = filesystem(url, storage_options)
    base = node_dir(url, cache_dir)
    base_fd = url_dir_fd if url_dir_fd is not None else open_url_dir(
        url, cache_dir, trust, create=True
    )
    try:
        return _fetch(url, fs, root, base, base_fd, trust)
    finally:
        if url_dir_fd is None:
            os.close(base_fd)


def _fetch(url: str, fs: Any, root: str, base: Path, base_fd: int, trust: Trust) -> Path:
    """Copy the current version of ``url`` into ``base`` unless it is there; return it.

    Another process of the node copying the same version is waited for (as
    long as it takes: a dead copier releases its lock at once); a store that
    changes during the copy is copied again, up to :data:`_ATTEMPTS` times.
    """
    last: list[tuple[str, str]] = []
    attempts = _ATTEMPTS

    def get(tmp: Path, rels: list[str]) -> None:
        _get(fs, root, tmp, rels)

    for attempt in range(attempts):
        raw = read_group(fs, root, url)
        version = version_name(raw)
        if _have(base_fd, base / version, trust):
            return base / version
        try:
            return _publish_version(base, base_fd, version, trust,
                                    functools.partial(_download, get, raw, trust=trust))
        except _ChangedError as changed:
            last = changed.bad
        if attempt + 1 < attempts:
            time.sleep(0.5 * 2**attempt)  # the store may be being replaced: look again
    shown = "; ".join(f"{rel}: {why}" for rel, why in last[:5])
    raise CorruptStoreError(
        f"the files of {url!r} do not match its {GROUP} after {attempts} attempts ({shown}"
        f"{' ...' if len(last) > 5 else ''}); the remote store is damaged or is being "
        "overwritten - rebuild or re-upload it, or retry when the upload has finished",
        url,
    )


def _publish_version(
    base: Path, base_fd: int, version: str, trust: Trust, fill: Callable[[Path], object]
) -> Path:
    """Make the version directory ``base / version`` unless it is there: ``fill`` a hidden
    sibling, then publish it with one rename, under the version's download lock."""
    local = base / version
    with ExclusiveLock(base / f"{version}.lock", what="fetch", trust=trust) as lock:
        lock.acquire()
        if _have(base_fd, local, trust):  # made meanwhile by another process
            return local
        _collect_fetch_debris(base, version)
        tmp = _fetch_tmp(local)
        make_dir(tmp, trust, exist_ok=False)
        try:
            fill(tmp)
            return _rename_version(tmp, local, base, trust)
        except BaseException:
            remove_tree(tmp)
            raise


def _rename_version(tmp: Path, local: Path, base: Path, trust: Trust) -> Path:
    """Publish the complete directory ``tmp`` as the version ``local`` (``tmp`` goes if the
    version is there already)."""
    # the holds file exists before the version does: an evictor finds a version a reader is
    # about to open locked by it, never without a holds file
    os.close(create_file(local.with_name(local.name + HOLDS_SUFFIX), trust, flags=os.O_RDWR,
                         kind="member-write", exclusive=False))
    try:
        tmp.rename(local)
    except OSError:
        if not local.is_dir():
            raise
        remove_tree(tmp)  # published meanwhile by a process that did not lock
        return local
    fsync_dir(base)
    return local


def install_bundle(
    bundle: Bundle, url: str, *, cache_dir: str | os.PathLike[str], trust: Trust
) -> Path:
    """Make the store at ``url`` whose bundle is ``bundle`` a version of the node cache; return it.

    Its metadata and index come from the bundle, each file checked against
    the size and XXH3-128 its group ``zarr.json`` lists (as a download is);
    its data files are fetched from ``url`` when first read.

    Raises
    ------
    CorruptStoreError
        If the bundle's files do not match their metadata.
    """
    raw = bundle.read_file(GROUP)
    version = version_name(raw)
    base = node_dir(url, cache_dir)
    base_fd = open_url_dir(url, cache_dir, trust, create=True)

    def get(tmp: Path, rels: list[str]) -> None:
        for rel in rels:
            write_bytes_durable(tmp / rel, bundle.read_file(rel), trust=trust)

    try:
        if _have(base_fd, base / version, trust):
            return base / version
        try:
            return _publish_version(base, base_fd, version, trust,
                                    functools.partial(_download, get, raw, trust=trust))
        except _ChangedError as bad:
            shown = "; ".join(f"{rel}: {why}" for rel, why in bad.bad[:5])
            raise CorruptStoreError(f"{bundle.where!r} holds files that do not match its "
                                    f"{GROUP} ({shown})", bundle.where) from None
    finally:
        os.close(base_fd)


def adopt_version(
    built: Path, url: str, *, cache_dir: str | os.PathLike[str], trust: Trust
) -> Path:
    """Move the store directory ``built`` (uploaded to ``url``) into the node cache as the
    version of ``url`` it is, data files included; return the version directory.

    ``built`` must lie on the node cache's filesystem and have the cache's
    modes. Its bytes are added to the node cache's usage (a capped cache
    evicts to make room at its next download).
    """
    version = version_name((built / GROUP).read_bytes())
    base = node_dir(url, cache_dir)
    base_fd = open_url_dir(url, cache_dir, trust, create=True)
    try:
        with ExclusiveLock(base / f"{version}.lock", what="fetch", trust=trust) as lock:
            lock.acquire()
            if _have(base_fd, base / version, trust):
                remove_tree(built)  # the same bytes, by their checksums
                return base / version
            size = disk_usage(built)
            local = _rename_version(built, base / version, base, trust)
    finally:
        os.close(base_fd)
    NodeCache(base.parent, trust).add(size)
    return local


def _have(base_fd: int, local: Path, trust: Trust) -> bool:
    """Whether the copy ``local`` is here: opened (in its checked URL directory) and checked."""
    try:
        fd = open_dir(local.name, trust, dir_fd=base_fd, shown=local)
    except (FileNotFoundError, NotADirectoryError):
        return False
    os.close(fd)
    return True


def _fetch_tmp(local: Path) -> Path:
    return temp_path(local, "fetch")
