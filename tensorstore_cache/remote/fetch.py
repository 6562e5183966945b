"""Stores at fsspec URLs (``s3://``, ``gs://``, ``memory://``, ...): copied once per node, then mapped.

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
local copy. Copies are immutable; pickling a store opened from a URL
re-opens the same local copy when it exists (no request), else the URL.

Building into a URL builds into a local staging directory, then uploads
every file, the group ``zarr.json`` last; see :func:`build_remote` for what
object stores guarantee.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import xxhash

from ..errors import CorruptStoreError, StoreExistsError, StoreNotFoundError
from ..format.metadata import ATTR_KEY, INDEX_ARRAYS, MAX_GROUP_JSON, VECTORS, parse_group
from ..fs.durable import fsync_dir, read_json, write_bytes_durable
from ..fs.locks import BuildLock
from ..fs.temp import collect_temp_siblings, discard, temp_sibling
from ..reader.segment import Segment
from ..reader.store import CacheStore

__all__ = [
    "build_remote",
    "fetch_store",
    "file_url_path",
    "is_url",
    "open_remote",
    "remote_cache_root",
    "reopen_remote",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")
_GROUP = "zarr.json"
_ARRAY_DIRS = (VECTORS, *INDEX_ARRAYS)
_FETCH_MARK = ".tsc-fetch-"


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def file_url_path(url: str) -> Path | None:
    """Return the local path of a ``file://`` URL, ``None`` for any other URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() != "file":
        return None
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{url!r} names a file on host {parsed.netloc!r}; use a local path")
    return Path(urllib.parse.unquote(parsed.path))


def remote_cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory under which remote stores are copied (``<cache_dir>/remote``)."""
    if cache_dir is None:
        from ..cache.namespace import default_cache_dir

        return default_cache_dir() / "remote"
    return Path(os.fspath(cache_dir)).expanduser() / "remote"


def _fsspec(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    try:
        import fsspec.core
    except ImportError:  # pragma: no cover - fsspec is installed with the remote extra
        raise ImportError(
            f"opening {url!r} needs fsspec (and the filesystem's package, e.g. s3fs): "
            "pip install 'tensorstore_cache[remote]'"
        ) from None
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, str(root).rstrip("/")


def _url_dir(url: str) -> str:
    """Cache directory name of a URL: a readable tail plus the hash of the whole URL."""
    canonical = url.rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", canonical.rsplit("/", 1)[-1])[:48] or "store"
    return f"{tail}-{xxhash.xxh3_64_hexdigest(canonical.encode())}"


def _read_group(fs: Any, root: str, url: str) -> bytes:
    """Read the remote group ``zarr.json`` with one request, refusing oversized ones."""
    try:
        raw = fs.cat_file(f"{root}/{_GROUP}", start=0, end=MAX_GROUP_JSON + 1)
    except FileNotFoundError:
        raise StoreNotFoundError(
            f"no store at {url!r} (no {_GROUP}); build one with "
            "tensorstore_cache.build_store(paths, url) (or check the URL)"
        ) from None
    if len(raw) > MAX_GROUP_JSON:
        raise CorruptStoreError(
            f"{url}/{_GROUP} is larger than the {MAX_GROUP_JSON} bytes allowed", url
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
        h = xxhash.xxh3_128()
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        if h.hexdigest() != digest:
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
    write_bytes_durable(tmp / _GROUP, raw)
    # array metadata first (small, fixed names): parse_group then validates everything
    meta = [f"{name}/{_GROUP}" for name in _ARRAY_DIRS]
    for rel in meta:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    _get(fs, root, tmp, meta)  # read_json caps their size; checksums are checked below
    try:
        _spec, files, _ = parse_group(tmp)
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
    collect_temp_siblings(base, f".{version}{_FETCH_MARK}", 24 * 3600.0)


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
    fs, root = _fsspec(url, storage_options)
    base = remote_cache_root(cache_dir) / _url_dir(url)
    last: list[tuple[str, str]] = []
    for attempt in range(max(1, attempts)):
        raw = _read_group(fs, root, url)
        version = xxhash.xxh3_128_hexdigest(raw)
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
                    discard(tmp)  # published meanwhile by a process that did not lock
                    return local
                fsync_dir(base)
                return local
            except _ChangedError as changed:
                discard(tmp)
                last = changed.bad
            except BaseException:
                discard(tmp)
                raise
        if attempt + 1 < attempts:
            time.sleep(0.5 * 2**attempt)  # the store may be being replaced: look again
    shown = "; ".join(f"{rel}: {why}" for rel, why in last[:5])
    raise CorruptStoreError(
        f"the files of {url!r} do not match its {_GROUP} after {attempts} attempts ({shown}"
        f"{' ...' if len(last) > 5 else ''}); the remote store is damaged or is being "
        "overwritten - rebuild or re-upload it, or retry when the upload has finished",
        url,
    )


def _fetch_tmp(local: Path) -> Path:
    return temp_sibling(local, _FETCH_MARK)


def open_remote(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> CacheStore:
    """Open the store at an fsspec URL through its node-local copy (see :func:`fetch_store`)."""
    path = file_url_path(url)
    if path is not None:
        from ..reader.store import open_store

        return open_store(path)
    local = fetch_store(url, cache_dir=cache_dir, storage_options=storage_options)
    return _open_copy(url, local, cache_dir, storage_options)


def _open_copy(
    url: str,
    local: Path,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None,
) -> CacheStore:
    segment = Segment(local)
    options = None if storage_options is None else dict(storage_options)
    cache = None if cache_dir is None else os.fspath(cache_dir)
    return CacheStore(
        [segment], segment.spec, str(local), reopen=(reopen_remote, (url, str(local), cache, options))
    )


def reopen_remote(
    url: str, local: str, cache_dir: str | None, storage_options: dict[str, Any] | None
) -> CacheStore:
    """Unpickle a store opened from a URL: its local copy if this node has it, else the URL."""
    if os.path.isfile(os.path.join(local, _GROUP)):
        return _open_copy(url, Path(local), cache_dir, storage_options)
    return open_remote(url, cache_dir=cache_dir, storage_options=storage_options)


def build_remote(
    paths: Iterable[str | os.PathLike[str]],
    url: str,
    *,
    overwrite: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **build_options: Any,
) -> CacheStore:
    """Build a store locally, upload it to ``url`` (group ``zarr.json`` last), open it.

    The local build (staged under ``<cache_dir>/remote``) becomes this node's
    copy of the uploaded version, so opening it downloads nothing.

    Notes
    -----
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
    path = file_url_path(url)
    if path is not None:
        from ..writer.build import build_store

        return build_store(paths, path, overwrite=overwrite, **build_options)
    fs, root = _fsspec(url, storage_options)
    group = f"{root}/{_GROUP}"
    if not overwrite and fs.exists(group):
        raise StoreExistsError(
            f"{url!r} already holds a store; pass overwrite=True to replace it, or open it "
            "with tensorstore_cache.open_store"
        )
    base = remote_cache_root(cache_dir) / _url_dir(url)
    base.mkdir(parents=True, exist_ok=True)
    staging = _fetch_tmp(base / "upload")
    staging.mkdir()
    try:
        from ..writer.build import build_store

        build_store(paths, staging / "store", **build_options).close()
        raw = _upload(staging / "store", fs, root, overwrite)
        local = base / xxhash.xxh3_128_hexdigest(raw)
        try:
            (staging / "store").rename(local)
            fsync_dir(base)
        except OSError:
            pass  # this version is already here (identical bytes, by its checksums)
    finally:
        discard(staging)
    return open_remote(url, cache_dir=cache_dir, storage_options=storage_options)


def _upload(local: Path, fs: Any, root: str, overwrite: bool) -> bytes:
    """Upload the store at ``local`` to ``root``: data, then array metadata, group ``zarr.json`` last."""
    raw = (local / _GROUP).read_bytes()
    group = read_json(local / _GROUP, max_bytes=MAX_GROUP_JSON)
    files = sorted(group["attributes"][ATTR_KEY]["files"])
    if overwrite:
        with contextlib.suppress(FileNotFoundError):  # readers now find no store, not a mixed one
            fs.rm_file(f"{root}/{_GROUP}")
    data = [rel for rel in files if not rel.endswith(_GROUP)]
    meta = [rel for rel in files if rel.endswith(_GROUP)]
    for part in (data, meta):
        if part:
            fs.put([str(local / rel) for rel in part], [f"{root}/{rel}" for rel in part])
    fs.pipe_file(f"{root}/{_GROUP}", raw)
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
