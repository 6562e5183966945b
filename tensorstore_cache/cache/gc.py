"""Housekeeping of a cache directory: :func:`list_caches` and :func:`gc`.

What :func:`gc` may delete, and what it never deletes:

* a namespace whose build lock is held (a build is running) is left alone
  entirely; :func:`gc` holds the lock itself while it works on a namespace;
* whole namespaces are deleted by age (``older_than``: not used by
  ``cached()``/``open_store`` for that long) or by size (``max_bytes``: the
  least recently used first). Processes that still map their files keep
  reading them (Linux keeps an unlinked file alive while it is mapped, and
  cached stores map every file when they open);
* inside a namespace: temporary directories of dead builders, and parts no
  manifest references any more (replaced by a merge) once no process maps
  them (readers hold a shared lock) and they are older than ``grace``;
  superseded manifests older than ``grace``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..format.hashes import HASH_SUFFIX
from ..fs.locks import BuildLock, read_holder, try_exclusive
from ..fs.temp import age_text, disk_usage, remove_tree
from ..writer.build import build_dir_target, collect_debris
from .namespace import Namespace

__all__ = ["CacheInfo", "Removed", "gc", "list_caches"]


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """One namespace of a cache directory, as listed by :func:`list_caches`."""

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


@dataclass(frozen=True, slots=True)
class Removed:
    """Something :func:`gc` deleted (or would delete, with ``dry_run``)."""

    path: str
    """The file or directory."""
    kind: str
    """``"namespace"``, ``"part"``, ``"debris"`` or ``"manifest"``."""
    bytes: int
    """Bytes it took on disk."""
    reason: str
    """Why it went, e.g. ``"unused for 9 days"``."""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _last_used(ns: Namespace) -> float:
    return max(_mtime(ns.last_used_path), _mtime(ns.root / "namespace.json"))


def _namespaces(root: Path) -> list[Namespace]:
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    return [
        Namespace(e) for e in entries
        if not e.name.startswith(".") and e.is_dir() and (e / "namespace.json").is_file()
    ]


def _building(ns: Namespace) -> str | None:
    probe = BuildLock(ns.lock_path, what="list")
    if not ns.lock_path.exists():
        return None
    got = probe.try_acquire()
    if got:
        probe.release()
        return None
    if got is None:
        return None
    holder = read_holder(ns.lock_path)
    return holder.describe() if holder is not None else "another process"


def list_caches(cache_dir: str | os.PathLike[str] | None = None) -> list[CacheInfo]:
    """Describe every namespace of a cache directory.

    Parameters
    ----------
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).

    Returns
    -------
    list of CacheInfo
        Most recently used first. Damaged namespaces are listed with
        ``loader_id="?"``.
    """
    root = Path(os.fspath(cache_dir)) if cache_dir is not None else config.default_cache_dir()
    out = []
    for ns in _namespaces(root.expanduser()):
        try:
            info = ns.info()
            manifest = ns.current()
        except (CorruptStoreError, StoreNotFoundError):
            info, manifest = {"loader_id": "?", "loader_params": {}, "dtype": "?"}, None
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
                last_used=datetime.fromtimestamp(_last_used(ns), UTC),
                generation=manifest.generation if manifest else 0,
                building=_building(ns),
            )
        )
    out.sort(key=lambda c: c.last_used, reverse=True)
    return out


def _seconds(value: float | timedelta | None, name: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return seconds


def _remove(path: Path) -> None:
    """Delete a namespace or a part, renamed aside first to a name the next ``gc`` finishes removing."""
    remove_tree(path, aside=path.with_name(f".{path.name}{config.GC_MARK}{uuid.uuid4().hex[:8]}"))


def _tidy(ns: Namespace, grace: float, now: float, dry_run: bool) -> list[Removed]:
    """Collect debris, unreferenced parts and old manifests of one (locked) namespace."""
    out: list[Removed] = []
    try:
        manifest = ns.current()
    except CorruptStoreError:
        return out  # never guess what a damaged manifest referenced
    live = set(manifest.parts) if manifest else set()
    since = _mtime(manifest.path) if manifest else 0.0
    try:
        entries = sorted(ns.parts_dir.iterdir())
    except FileNotFoundError:
        entries = []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            target = build_dir_target(name)
            if target is not None:  # a builder's temporary directory
                before = disk_usage(entry)
                if dry_run:
                    if now - _mtime(entry) > grace:
                        out.append(Removed(str(entry), "debris", before, "left by a builder"))
                    continue
                collect_debris(entry.parent / target, max_age_s=grace)
                if not entry.exists():
                    out.append(Removed(str(entry), "debris", before, "left by a dead builder"))
            elif config.GC_MARK in name and not dry_run:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        if name.endswith(HASH_SUFFIX):
            part = name[: -len(HASH_SUFFIX)]
            if part not in live and not (ns.parts_dir / part).exists() and now - _mtime(entry) > grace:
                out.append(Removed(str(entry), "part", disk_usage(entry), "hash file of a removed part"))
                if not dry_run:
                    entry.unlink(missing_ok=True)
            continue
        if name in live or not entry.is_dir():
            continue
        idle = now - max(_mtime(entry), since)
        if idle <= grace:
            continue
        free, fd = try_exclusive(entry / "zarr.json")
        if not free and (entry / "zarr.json").exists():
            continue  # a process maps it
        try:
            side = ns.parts_dir / (name + HASH_SUFFIX)
            size = disk_usage(entry) + disk_usage(side)
            out.append(Removed(str(entry), "part", size, f"not current for {age_text(idle)}, unused"))
            if not dry_run:
                _remove(entry)
                side.unlink(missing_ok=True)
        finally:
            if fd is not None:
                os.close(fd)
    if manifest is not None:
        for gen in ns.generations():
            path = ns.manifest_path(gen)
            if gen < manifest.generation and now - _mtime(path) > grace:
                out.append(Removed(str(path), "manifest", disk_usage(path), "superseded"))
                if not dry_run:
                    path.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        for tmp in ns.manifests_dir.iterdir():
            if tmp.name.startswith(".") and now - _mtime(tmp) > grace and not dry_run:
                tmp.unlink(missing_ok=True)
    return out


def gc(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    older_than: float | timedelta | None = None,
    max_bytes: int | None = None,
    grace: float | timedelta = 3600.0,
    dry_run: bool = False,
) -> list[Removed]:
    """Delete what a cache directory no longer needs.

    Always: temporary directories of dead builders, parts that are no longer
    current and that no process maps (older than ``grace``), superseded
    manifests. Optionally whole namespaces, by age and by total size.
    Namespaces whose build lock is held are never touched.

    Parameters
    ----------
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).
    older_than
        Delete namespaces not used (opened by ``cached()`` or ``open_store``)
        for this long: seconds or a :class:`~datetime.timedelta`.
    max_bytes
        Then delete least recently used namespaces until the directory
        holds at most this many bytes.
    grace
        Minimum age of a non-current part, a manifest or a builder's
        leftovers before they are deleted (default one hour).
    dry_run
        Only report what would be deleted.

    Returns
    -------
    list of Removed
        What was deleted (or would be), with its size and the reason.

    Examples
    --------
    >>> freed = gc(older_than=timedelta(days=30), max_bytes=50 << 30)  # doctest: +SKIP
    >>> sum(r.bytes for r in freed)                                    # doctest: +SKIP
    """
    old = _seconds(older_than, "older_than")
    grace_s = _seconds(grace, "grace") or 0.0
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, got {max_bytes!r}")
    root = (Path(os.fspath(cache_dir)) if cache_dir is not None else config.default_cache_dir()).expanduser()
    now = time.time()
    out: list[Removed] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in root.iterdir():  # namespaces a previous gc renamed aside and did not finish
            if entry.name.startswith(".") and config.GC_MARK in entry.name and not dry_run:
                shutil.rmtree(entry, ignore_errors=True)
    kept: list[tuple[float, int, Namespace]] = []
    for ns in _namespaces(root):
        lock = BuildLock(ns.lock_path, what="gc")
        got = lock.try_acquire()
        if got is False:
            continue  # a build is running: leave this namespace alone
        try:
            used = _last_used(ns)
            if old is not None and now - used > old:
                size = disk_usage(ns.root)
                out.append(Removed(str(ns.root), "namespace", size, f"unused for {age_text(now - used)}"))
                if not dry_run:
                    _remove(ns.root)
                continue
            out.extend(_tidy(ns, grace_s, now, dry_run))
            kept.append((used, disk_usage(ns.root), ns))
        finally:
            lock.release()
    if max_bytes is not None:
        total = sum(size for _used, size, _ns in kept)
        if dry_run:
            total -= sum(r.bytes for r in out if r.kind != "namespace")
        for used, size, ns in sorted(kept, key=lambda t: t[0]):
            if total <= max_bytes:
                break
            lock = BuildLock(ns.lock_path, what="gc")
            if lock.try_acquire() is False:
                continue
            try:
                out.append(Removed(str(ns.root), "namespace", size,
                                   f"least recently used ({age_text(now - used)} ago), over max_bytes"))
                if not dry_run:
                    _remove(ns.root)
                total -= size
            finally:
                lock.release()
    return out
