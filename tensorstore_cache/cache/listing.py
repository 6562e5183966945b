"""Listing a cache directory: :func:`list_caches` and what it reports (:class:`CacheInfo`).

Every namespace is described by the same opens ``cached()`` makes, so a
namespace ``cached()`` would refuse (another user's, or writable by others)
is listed as refused, with the reason, and nothing of it is read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, overload

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError, UntrustedCacheError
from ..fs import Trust, describe_owner, disk_usage, is_held, open_root, read_holder, resolve_trust
from ..reader import view_of
from ..remote import RemoteCacheInfo
from .namespace import Namespace
from .remote_tools import list_remote

__all__ = ["CacheInfo", "last_used", "list_caches", "mtime", "namespaces"]


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """One namespace of a cache directory, as listed by :func:`list_caches`.

    Examples
    --------
    >>> _ = tsc.cached(paths, progress=False)
    >>> [info] = tsc.list_caches()
    >>> info.loader_id, info.item_shape, info.entries, info.parts, info.refused
    ('tensorstore_cache.image/1', (3, 32, 32), 8, 1, None)
    """

    namespace: str
    """Directory name: ``<loader slug>-<dtype>-<fingerprint>``."""
    path: str
    """The namespace directory."""
    loader_id: str
    """Identifier of the loader that computed its vectors."""
    params: dict[str, Any]
    """The loader's parameters."""
    dtype: str
    """Element type of the vectors."""
    item_shape: tuple[int, ...] | None
    """Shape of one vector (None before the first build)."""
    entries: int
    """Distinct keys in the current generation."""
    parts: int
    """Live parts in the current generation."""
    bytes: int
    """Bytes on disk, everything in the directory included."""
    last_used: datetime
    """When ``cached()`` or ``open_store`` last opened it (UTC)."""
    generation: int
    """Current manifest generation (0: nothing published yet)."""
    building: str | None
    """Who holds the build lock right now (``"pid 42 on host x (build, for 3 s)"``), or None."""
    owner: str = ""
    """Owner of the namespace directory (a user name, or ``"uid N"``)."""
    group: str = ""
    """Its group (a name, or the number)."""
    mode: str = ""
    """Its mode as ``ls -l`` shows it (``"drwx------"``)."""
    refused: str | None = None
    """Why :func:`~tensorstore_cache.cached` (with the listing's ``share_with``) would refuse
    it, in short (``"parts/…: owned by mallory"``), or None: found by the opens ``cached()``
    makes, the cache directory, the namespace and every file of its live parts included."""
    refused_message: str | None = None
    """The full refusal, with the fix."""
    fields: tuple[str, ...] = ()
    """The field names of a cache of records, in schema order (empty for one tensor per
    key, or before the first build of an inferred schema)."""


def mtime(path: Path) -> float:
    """``path``'s modification time (0 if it cannot be read)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def last_used(ns: Namespace) -> float:
    """When ``cached()`` or ``open_store`` last opened ``ns`` (seconds since the epoch)."""
    # another user's private namespace cannot be looked into: its directory's own time then
    return max(mtime(ns.last_used_path), mtime(ns.root / "namespace.json")) or mtime(ns.root)


def namespaces(root: Path, trust: Trust) -> list[Namespace]:
    """The namespaces of the cache directory ``root``, by name."""
    try:
        entries = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    return [
        Namespace(e, trust=trust) for e in entries
        if not e.name.startswith(".") and _is_dir(e) and _exists(e / "namespace.json")
    ]


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _exists(path: Path) -> bool:
    try:
        path.lstat()
    except PermissionError:
        return True  # another user's private namespace: listed (and refused)
    except OSError:
        return False
    return True


def _building(ns: Namespace) -> str | None:
    if not is_held(ns.lock_path):
        return None
    holder = read_holder(ns.lock_path)
    return holder.describe() if holder is not None else "another process"


def _refusal(ns: Namespace) -> tuple[UntrustedCacheError | None, tuple[str, ...]]:
    """What ``cached()`` would refuse in ``ns`` (the same opens, every live file included),
    and the field names of its parts (records)."""
    fields: tuple[str, ...] = ()
    try:
        manifest = ns.current()
        if manifest is not None and manifest.parts:
            with ns.open_parts(manifest.parts, pin=False) as store:
                for seg in view_of(store).segments:
                    seg.map_all()  # every file of every field
                    seg.content_hashes()
                fields = tuple(f.name for f in store.spec.fields)
        ns.info()
    except UntrustedCacheError as exc:
        return exc, ()
    except (CorruptStoreError, StoreNotFoundError, OSError):
        return None, ()  # damaged or vanished: listed as such, not as untrusted
    return None, fields


def _declared(info: dict[str, Any]) -> tuple[str, ...]:
    """The field names a namespace's description declares (none: tensors, or inferred)."""
    declared = info.get("fields")
    if isinstance(declared, list):
        return tuple(str(f.get("name")) for f in declared if isinstance(f, dict))
    return ()


def _short(exc: UntrustedCacheError, root: Path) -> str:
    try:
        where = os.path.relpath(exc.path, root)
    except ValueError:
        where = exc.path
    return f"{where}: {exc.reason}"


@overload
def list_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, share_with: str | int | None = None,
    remote: None = None, storage_options: None = None,
) -> list[CacheInfo]: ...


@overload
def list_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, share_with: str | int | None = None,
    remote: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
) -> list[RemoteCacheInfo]: ...


def list_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, share_with: str | int | None = None,
    remote: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[CacheInfo] | list[RemoteCacheInfo]:
    """Describe every namespace of a cache directory (or of a remote prefix).

    Parameters
    ----------
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).
    share_with
        List it as a cache shared with this group (see
        :func:`~tensorstore_cache.cached`; default ``$TSC_CACHE_GROUP``, else
        private): what ``refused`` reports depends on it.
    remote
        List this prefix shared by ``cached(remote=...)`` instead (a URL or a
        shared directory; never ``$TSC_REMOTE``): each namespace's current
        generation, its parts, and who holds its current lease, for how long.
    storage_options
        With ``remote``: options of its fsspec filesystem (credentials, ...).

    Returns
    -------
    list of CacheInfo, or of RemoteCacheInfo with ``remote``
        Most recently used first (by name with ``remote``). Damaged namespaces
        are listed with ``loader_id="?"``; those ``cached()`` would refuse
        (another user's, or writable by others) with ``refused`` set, their
        files not read.

    Examples
    --------
    >>> _ = tsc.cached(paths, progress=False)
    >>> _ = tsc.cached(paths, size=(64, 64), progress=False)
    >>> [(c.item_shape, c.entries) for c in tsc.list_caches()]  # most recently used first
    [((3, 64, 64), 8), ((3, 32, 32), 8)]
    """
    if remote is not None:
        return list_remote(remote, storage_options)
    trust = resolve_trust(share_with)
    root = config.cache_root(cache_dir)
    top: UntrustedCacheError | None = None
    try:
        os.close(open_root(root, trust))
    except UntrustedCacheError as exc:
        top = exc  # every namespace in it would be refused
    except OSError:
        pass
    out = []
    for ns in namespaces(root, trust):
        refusal, fields = (top, ()) if top is not None else _refusal(ns)
        info: dict[str, Any] = {"loader_id": "?", "loader_params": {}, "dtype": "?"}
        manifest = None
        if refusal is None:
            try:
                info = ns.info()
                manifest = ns.current()
            except (CorruptStoreError, StoreNotFoundError):
                pass
        try:
            owner, group, mode = describe_owner(ns.root.lstat())
        except OSError:
            owner = group = mode = "?"
        ns.close()
        out.append(
            CacheInfo(
                namespace=ns.root.name,
                path=str(ns.root),
                loader_id=str(info.get("loader_id")),
                params=dict(info.get("loader_params") or {}),
                dtype=str(info.get("dtype")),
                item_shape=manifest.item_shape if manifest else None,
                entries=manifest.entries if manifest else 0,
                parts=len(manifest.parts) if manifest else 0,
                bytes=disk_usage(ns.root),
                last_used=datetime.fromtimestamp(last_used(ns), UTC),
                generation=manifest.generation if manifest else 0,
                building=_building(ns),
                owner=owner,
                group=group,
                mode=mode,
                refused=None if refusal is None else _short(refusal, root),
                refused_message=None if refusal is None else str(refusal),
                fields=fields or _declared(info),
            )
        )
    out.sort(key=lambda c: c.last_used, reverse=True)
    return out
