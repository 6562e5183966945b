"""Uploading a store to an fsspec URL, shard by shard as it is built, group ``zarr.json`` last.

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

A build uploads as it goes: each shard task writes its shard to a local
temporary file and sends it with :func:`upload_file` (from whichever process
or machine runs the task), and the building process then sends the index,
the array metadata and the group ``zarr.json`` with :func:`upload_store`.
With ``overwrite=True`` the old group ``zarr.json`` is withdrawn
(:func:`withdraw_store`) before the first shard is sent, since shards are
replaced in place. A build that fails removes what it sent
(:func:`discard_upload`), and never writes a group ``zarr.json``.

A ``file://`` URL or a path (a directory every machine mounts) is written as
an object store is: each file copied to a temporary name beside its own,
flushed to disk and renamed over it (a reader sees a whole file or none),
its directories made on the way.

A build may also send objects that are no part of the store (its *scratch*:
the ragged runs of a store of records, which its builder downloads and
assembles); the builder names their directories, and they are deleted with
everything else a failed build sent, and after the group ``zarr.json`` of a
good one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import StoreExistsError
from ..format import FIELDS, GROUP, INDEX_ARRAYS, VECTORS, GroupMetadata
from ..fs import Trust, fsync_dir, make_dir, temp_path
from .urls import filesystem, node_dir, open_url_dir, redact, version_name

__all__ = [
    "check_target",
    "discard_files",
    "discard_upload",
    "download_files",
    "shared_between_processes",
    "staging_dir",
    "upload_file",
    "upload_store",
    "withdraw_store",
]

_ARRAY_DIRS = (VECTORS, FIELDS, *INDEX_ARRAYS)


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


def shared_between_processes(url: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether other processes see what one writes at ``url`` (``memory://`` is one process's)."""
    fs, _root = filesystem(url, storage_options)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "memory" not in protocols


def withdraw_store(url: str, *, storage_options: Mapping[str, Any] | None) -> None:
    """Delete the group ``zarr.json`` at ``url`` (if any): readers then find no store there."""
    fs, root = filesystem(url, storage_options)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(f"{root}/{GROUP}")


def upload_file(
    path: Path, url: str, rel: str, *, storage_options: Mapping[str, Any] | None
) -> None:
    """Upload the local file ``path`` as ``rel`` of the store at ``url`` (one atomic object).

    An error is noted with the object, the store and the machine it was sent from (a
    build's task may run on another machine than its builder)."""
    fs, root = filesystem(url, storage_options)
    try:
        _put(fs, [(path, f"{root}/{rel}")])
    except Exception as exc:
        exc.add_note(f"while uploading {rel!r} of {redact(url)!r} from {socket.gethostname()} "
                     f"(process {os.getpid()}): every process running a build's tasks needs "
                     "write access there, by the storage_options= of the build or by its "
                     "machine's own credentials")
        raise


def download_files(
    url: str, rels: list[str], local: Path, *, storage_options: Mapping[str, Any] | None
) -> None:
    """Download files ``rels`` of the store being uploaded to ``url`` into ``local``."""
    if rels:
        fs, root = filesystem(url, storage_options)
        for rel in rels:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
        fs.get([f"{root}/{rel}" for rel in rels], [str(local / rel) for rel in rels])


def discard_files(
    url: str, rels: list[str], *, storage_options: Mapping[str, Any] | None
) -> None:
    """Delete the objects ``rels`` of the store being built at ``url`` (missing ones too)."""
    if rels:
        fs, root = filesystem(url, storage_options)
        with contextlib.suppress(FileNotFoundError):
            fs.rm([f"{root}/{rel}" for rel in rels])


def discard_upload(
    url: str, *, storage_options: Mapping[str, Any] | None, scratch: Sequence[str] = ()
) -> None:
    """Delete what a failed build sent to ``url``: every file of its arrays, and every
    object under the directories ``scratch`` (the build's own, not the store's).

    Only while no group ``zarr.json`` is there: a store published at ``url``
    meanwhile (by another builder) is left alone. Objects of other names
    under ``url`` are never touched.
    """
    fs, root = filesystem(url, storage_options)
    if fs.exists(f"{root}/{GROUP}"):
        return
    found = _array_files(fs, root, scratch)
    if found:
        fs.rm([f"{root}/{rel}" for rel in found])


def staging_dir(
    url: str, cache_dir: str | os.PathLike[str] | None = None, *, trust: Trust | None = None
) -> Path:
    """Create and return a fresh directory to build a store for ``url`` in, in the node cache.

    It lies on the filesystem of the node-local copies, so that the built
    store becomes this node's copy with one rename (:func:`upload_store`).
    The directories on the way are checked against ``trust`` (default: a
    private cache) and created with its modes.
    """
    trust = trust if trust is not None else Trust.private()
    base = node_dir(url, cache_dir)
    os.close(open_url_dir(url, cache_dir, trust, create=True))
    staging = temp_path(base / "upload", "fetch")
    make_dir(staging, trust, exist_ok=False)
    return staging


def upload_store(
    local: Path,
    url: str,
    *,
    uploaded: frozenset[str] = frozenset(),
    overwrite: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    trust: Trust | None = None,
    scratch: Sequence[str] = (),
) -> Path:
    """Upload the store directory ``local`` to ``url``; keep ``local`` as this node's copy,
    and return where that copy is (the version's directory in the node cache).

    Data files first, then the array metadata, the group ``zarr.json`` last;
    files in ``uploaded`` (shards the build's tasks sent) are at ``url``
    already and need not be in ``local``. Files of the store's arrays at
    ``url`` that the new store does not list (an old version's, a failed
    build's), and every object under the directories ``scratch`` (a build's
    scratch, see above), are deleted last. Afterwards ``local`` is moved into the
    node-local cache as the copy of the uploaded version, so opening ``url``
    on this node downloads nothing that ``local`` holds (missing shards are
    fetched when first read); ``local`` must lie on the same filesystem as
    ``node_dir(url, cache_dir)`` and have been built with the node cache's
    ``trust`` (its modes).
    """
    trust = trust if trust is not None else Trust.private()
    fs, root = filesystem(url, storage_options)
    raw = _upload(local, fs, root, overwrite, uploaded, trust, scratch)
    base = node_dir(url, cache_dir)
    os.close(open_url_dir(url, cache_dir, trust, create=True))
    copy = base / version_name(raw)
    try:
        local.rename(copy)
        fsync_dir(base)
    except OSError:
        pass  # this version is already here (identical bytes, by its checksums)
    return copy


def _upload(
    local: Path, fs: Any, root: str, overwrite: bool, uploaded: frozenset[str], trust: Trust,
    scratch: Sequence[str],
) -> bytes:
    """Upload the store at ``local`` to ``root``: data, then array metadata, group ``zarr.json`` last."""
    raw = (local / GROUP).read_bytes()
    listed = sorted(GroupMetadata.read(local, trust=trust).files)
    if overwrite:
        with contextlib.suppress(FileNotFoundError):  # readers now find no store, not a mixed one
            fs.rm_file(f"{root}/{GROUP}")
    files = [rel for rel in listed if rel not in uploaded]
    data = [rel for rel in files if not rel.endswith(GROUP)]
    meta = [rel for rel in files if rel.endswith(GROUP)]
    for part in (data, meta):
        if part:
            _put(fs, [(local / rel, f"{root}/{rel}") for rel in part])
    if _local(fs):
        _put(fs, [(local / GROUP, f"{root}/{GROUP}")])
    else:
        fs.pipe_file(f"{root}/{GROUP}", raw)
    keep = set(listed)
    stale = [rel for rel in _array_files(fs, root, scratch) if rel not in keep]
    if stale:
        fs.rm([f"{root}/{rel}" for rel in stale])
    return raw


def _local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (a path, or a directory every machine mounts)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols


def _put(fs: Any, files: list[tuple[Path, str]]) -> None:
    """Send the local files to their paths on ``fs``; on the local filesystem, each through
    a temporary name, flushed, renamed over its own (its directories made first)."""
    if not _local(fs) and len(files) == 1:
        fs.put_file(str(files[0][0]), files[0][1])
        return
    if not _local(fs):
        fs.put([str(src) for src, _dst in files], [dst for _src, dst in files])
        return
    for src, dst in files:
        final = Path(dst)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(final, "new")
        try:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(final.parent)


def _array_files(fs: Any, root: str, scratch: Sequence[str] = ()) -> list[str]:
    """Store-relative paths of every file of the store's arrays at ``root`` (and of the
    directories ``scratch``)."""
    prefix = root.strip("/") + "/"
    rels = []
    fs.invalidate_cache(root)  # other processes wrote here: list afresh
    for name in (*_ARRAY_DIRS, *scratch):
        try:
            found = fs.find(f"{root}/{name}")
        except FileNotFoundError:
            continue
        for path in found:
            rel = str(path).strip("/")
            if rel.startswith(prefix):
                rels.append(rel[len(prefix) :])
    return rels
