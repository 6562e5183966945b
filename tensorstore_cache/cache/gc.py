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
  superseded manifests older than ``grace``;
* never what belongs to another user (a namespace or part goes only if every
  file in it is the current user's) unless asked (``all_users=True``), and
  then only where the system lets this process delete it; what it kept is
  logged, with the owners.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError, UntrustedCacheError
from ..format.hashes import HASH_SUFFIX
from ..format.metadata import shard_count
from ..fs.locks import BuildLock, is_held, read_holder, try_exclusive
from ..fs.temp import age_text, disk_usage, remove_tree
from ..fs.trust import Trust, describe_owner, open_root, resolve_trust, user_name
from ..remote.budget import NodeCache, collect
from ..writer.build import build_dir_target, collect_debris
from .namespace import Namespace

logger = logging.getLogger("tensorstore_cache")

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


@dataclass(frozen=True, slots=True)
class Removed:
    """Something :func:`gc` deleted (or would delete, with ``dry_run``)."""

    path: str
    """The file or directory."""
    kind: Literal["namespace", "part", "debris", "manifest", "remote-shard", "remote-version"]
    """What it was (``"remote-shard"`` and ``"remote-version"``: the node cache of remote stores)."""
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
    # another user's private namespace cannot be looked into: its directory's own time then
    return max(_mtime(ns.last_used_path), _mtime(ns.root / "namespace.json")) or _mtime(ns.root)


def _namespaces(root: Path, trust: Trust) -> list[Namespace]:
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


def _refusal(ns: Namespace) -> UntrustedCacheError | None:
    """What ``cached()`` would refuse in ``ns``: the same opens, every live file included."""
    try:
        manifest = ns.current()
        if manifest is not None and manifest.parts:
            with ns.open_parts(manifest.parts, pin=False) as store:
                for seg in store.segments:
                    for k in range(shard_count(seg.spec)):
                        seg.shard(k)
                    seg.content_hashes()
        ns.info()
    except UntrustedCacheError as exc:
        return exc
    except (CorruptStoreError, StoreNotFoundError, OSError):
        return None  # damaged or vanished: listed as such, not as untrusted
    return None


def _short(exc: UntrustedCacheError, root: Path) -> str:
    try:
        where = os.path.relpath(exc.path, root)
    except ValueError:
        where = exc.path
    return f"{where}: {exc.reason}"


def list_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, share_with: str | int | None = None
) -> list[CacheInfo]:
    """Describe every namespace of a cache directory.

    Parameters
    ----------
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).
    share_with
        List it as a cache shared with this group (see
        :func:`~tensorstore_cache.cached`; default ``$TSC_CACHE_GROUP``, else
        private): what ``refused`` reports depends on it.

    Returns
    -------
    list of CacheInfo
        Most recently used first. Damaged namespaces are listed with
        ``loader_id="?"``; those ``cached()`` would refuse (another user's, or
        writable by others) with ``refused`` set, their files not read.
    """
    trust = resolve_trust(share_with)
    root = (Path(os.fspath(cache_dir)) if cache_dir is not None else config.default_cache_dir()).expanduser()
    top: UntrustedCacheError | None = None
    try:
        os.close(open_root(root, trust))
    except UntrustedCacheError as exc:
        top = exc  # every namespace in it would be refused
    except OSError:
        pass
    out = []
    for ns in _namespaces(root, trust):
        refusal = top or _refusal(ns)
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
                last_used=datetime.fromtimestamp(_last_used(ns), UTC),
                generation=manifest.generation if manifest else 0,
                building=_building(ns),
                owner=owner,
                group=group,
                mode=mode,
                refused=None if refusal is None else _short(refusal, root),
                refused_message=None if refusal is None else str(refusal),
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


def _survey(path: Path) -> tuple[int, set[int]]:
    """Bytes taken by ``path`` and the owners of everything in it (one walk, no symlinks followed)."""
    try:
        st = path.lstat()
    except OSError:
        return 0, set()
    owners = {st.st_uid}
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, owners
    total = 0
    for dirpath, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            with contextlib.suppress(OSError):  # removed meanwhile
                entry = os.lstat(os.path.join(dirpath, name))
                owners.add(entry.st_uid)
                if not stat.S_ISDIR(entry.st_mode):
                    total += entry.st_size
    return total, owners


class _Sweep:
    """What one :func:`gc` may delete: the current user's files, or with ``all_users`` anyone's
    that the system lets it delete; counts what it keeps."""

    def __init__(self, *, all_users: bool, dry_run: bool) -> None:
        self.all_users = all_users
        self.dry_run = dry_run
        self.me = os.geteuid()
        self.kept: list[tuple[str, int, set[int]]] = []  # (path, bytes, owners)
        self.denied: list[tuple[str, int]] = []

    def mine(self, path: Path) -> tuple[bool, int]:
        """Whether ``path`` may go (all of it the user's, or ``all_users``), and its size."""
        size, owners = _survey(path)
        if self.all_users or owners <= {self.me}:
            return True, size
        self.kept.append((str(path), size, owners - {self.me}))
        return False, size

    def remove(self, path: Path) -> bool:
        """Delete ``path`` (renamed aside first, to a name the next ``gc`` finishes removing)."""
        if self.dry_run:
            return True
        aside = path.with_name(f".{path.name}{config.GC_MARK}{uuid.uuid4().hex[:8]}")
        if path.is_dir() and not path.is_symlink():
            gone = remove_tree(path, aside=aside)
        else:
            try:
                path.unlink()
                gone = True
            except FileNotFoundError:
                gone = True
            except OSError:
                gone = False
        if not gone:
            self.deny(path, aside)
        return gone

    def deny(self, path: Path, aside: Path | None = None) -> None:
        """Count ``path`` as kept because the system does not let this process delete it."""
        size = disk_usage(path) or (disk_usage(aside) if aside is not None else 0)
        self.denied.append((str(path), size))

    def report(self) -> None:
        """Log, once, what was kept because of its owner or refused by the system."""
        if self.kept:
            names = sorted({user_name(u) for _p, _s, owners in self.kept for u in owners})
            logger.warning(
                "gc kept %d item(s) of other users (%s)%s; all_users=True (--all-users) "
                "removes them where the system allows", len(self.kept), ", ".join(names),
                _mib(sum(size for _p, size, _o in self.kept)),
            )
        if self.denied:
            logger.warning(
                "gc could not delete %d item(s)%s that the system does not let this user "
                "delete (e.g. %s); run gc as their owner or as root", len(self.denied),
                _mib(sum(size for _p, size in self.denied)), self.denied[0][0],
            )


def _mib(size: int) -> str:
    """``", 12.0 MiB"``; empty when nothing could be counted (files this user may not list)."""
    return f", {size / (1 << 20):.1f} MiB" if size else ""


def _tidy(ns: Namespace, grace: float, now: float, sweep: _Sweep) -> list[Removed]:
    """Collect debris, unreferenced parts and old manifests of one (locked) namespace."""
    out: list[Removed] = []
    dry_run = sweep.dry_run
    try:
        manifest = ns.current()
    except (CorruptStoreError, UntrustedCacheError):
        return out  # never guess what a damaged or untrusted manifest referenced
    live = set(manifest.parts) if manifest else set()
    since = _mtime(manifest.path) if manifest else 0.0
    try:
        entries = sorted(ns.parts_dir.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            target = build_dir_target(name)
            if target is not None:  # a builder's temporary directory
                before = disk_usage(entry)
                if dry_run:
                    if now - _mtime(entry) > grace and sweep.mine(entry)[0]:
                        out.append(Removed(str(entry), "debris", before, "left by a builder"))
                    continue
                collect_debris(entry.parent / target, max_age_s=grace, any_owner=sweep.all_users)
                if not entry.exists():
                    out.append(Removed(str(entry), "debris", before, "left by a dead builder"))
            elif config.GC_MARK in name and not dry_run and sweep.mine(entry)[0]:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        if name.endswith(HASH_SUFFIX):
            part = name[: -len(HASH_SUFFIX)]
            if part not in live and not (ns.parts_dir / part).exists() and now - _mtime(entry) > grace:
                ok, size = sweep.mine(entry)
                if ok and sweep.remove(entry):
                    out.append(Removed(str(entry), "part", size, "hash file of a removed part"))
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
            ok, size = sweep.mine(entry)
            if not ok:
                continue
            size += disk_usage(side)
            if sweep.remove(entry):
                out.append(Removed(str(entry), "part", size, f"not current for {age_text(idle)}, unused"))
                if not dry_run and side.exists() and sweep.mine(side)[0]:
                    sweep.remove(side)
        finally:
            if fd is not None:
                os.close(fd)
    if manifest is not None:
        for gen in ns.generations():
            path = ns.manifest_path(gen)
            if gen < manifest.generation and now - _mtime(path) > grace:
                ok, size = sweep.mine(path)
                if ok and sweep.remove(path):
                    out.append(Removed(str(path), "manifest", size, "superseded"))
    with contextlib.suppress(OSError):
        for tmp in ns.manifests_dir.iterdir():
            old = tmp.name.startswith(".") and now - _mtime(tmp) > grace
            if old and not dry_run and sweep.mine(tmp)[0]:
                sweep.remove(tmp)
    return out


def _lock(ns: Namespace, sweep: _Sweep) -> BuildLock | None:
    """The namespace's lock, taken for ``gc``; None if a build holds it or it cannot be opened.

    A lock this user may not use (another user's namespace) leaves the
    namespace alone: counted as kept, or with ``all_users`` retried without
    the owner rule and, if the system refuses that too, counted as not deletable.
    """
    lock = BuildLock(ns.lock_path, what="gc", trust=ns.trust)
    try:
        got = lock.try_acquire()
    except OSError:  # UntrustedCacheError included
        if not sweep.all_users:
            sweep.mine(ns.root)  # counted as kept if others own any of it
            return None
        lock = BuildLock(ns.lock_path, what="gc", trust=Trust.explicit(warn=False))
        try:
            got = lock.try_acquire()
        except OSError:
            sweep.deny(ns.root)
            return None
    if got is False:
        return None  # a build is running: leave this namespace alone
    return lock


def gc(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    older_than: float | timedelta | None = None,
    max_bytes: int | None = None,
    grace: float | timedelta = 3600.0,
    dry_run: bool = False,
    share_with: str | int | None = None,
    all_users: bool = False,
) -> list[Removed]:
    """Delete what a cache directory no longer needs.

    Always: temporary directories of dead builders, parts that are no longer
    current and that no process maps (older than ``grace``), superseded
    manifests, downloads left by dead processes in the node cache of remote
    stores (``<cache_dir>/remote``). Optionally whole namespaces and remote
    versions, by age and by total size; under ``max_bytes`` the node cache's
    shards and versions (least recently used first; they can be downloaded
    again) go before any namespace. Namespaces whose build lock is held,
    and shards or versions a live process maps or has open, are never
    touched, and neither is what belongs to other users unless
    ``all_users`` is given.

    Parameters
    ----------
    cache_dir
        The cache directory (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).
    older_than
        Delete namespaces not used (opened by ``cached()`` or ``open_store``),
        and versions of remote stores not opened, for this long: seconds or
        a :class:`~datetime.timedelta`.
    max_bytes
        Then delete least recently used namespaces until the directory
        holds at most this many bytes.
    grace
        Minimum age of a non-current part, a manifest or a builder's
        leftovers before they are deleted (default one hour).
    dry_run
        Only report what would be deleted.
    share_with
        The group the cache is shared with (see
        :func:`~tensorstore_cache.cached`; default ``$TSC_CACHE_GROUP``,
        else private): inside a namespace, only what ``cached()`` would
        trust is tidied.
    all_users
        Also delete other users' files (a member of a shared cache's group
        may delete other members' parts; root anything). Without it, a
        namespace or part goes only if every file in it is the current
        user's, and what is kept is logged (one warning, with the owners).
        Either way only what the system lets this process delete goes, and
        only that is reported.

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
    trust = resolve_trust(share_with)
    root = (Path(os.fspath(cache_dir)) if cache_dir is not None else config.default_cache_dir()).expanduser()
    now = time.time()
    sweep = _Sweep(all_users=all_users, dry_run=dry_run)
    out: list[Removed] = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():  # namespaces a previous gc renamed aside and did not finish
            trash = entry.name.startswith(".") and config.GC_MARK in entry.name
            if trash and not dry_run and sweep.mine(entry)[0]:
                shutil.rmtree(entry, ignore_errors=True)
    kept: list[tuple[float, int, Namespace]] = []
    for ns in _namespaces(root, trust):
        lock = _lock(ns, sweep)
        if lock is None:
            continue
        try:
            used = _last_used(ns)
            if old is not None and now - used > old:
                ok, size = sweep.mine(ns.root)
                if ok:
                    if sweep.remove(ns.root):
                        out.append(Removed(str(ns.root), "namespace", size,
                                           f"unused for {age_text(now - used)}"))
                    continue
            out.extend(_tidy(ns, grace_s, now, sweep))
            kept.append((used, disk_usage(ns.root), ns))
        finally:
            lock.release()
            ns.close()
    remote = root / "remote"
    total = sum(size for _used, size, _ns in kept)
    if dry_run:
        total -= sum(r.bytes for r in out if r.kind != "namespace")
    remote_bytes = NodeCache(remote).scan_only().total
    need = 0 if max_bytes is None else total + remote_bytes - max_bytes
    # remote copies go first: they can be downloaded again, a namespace's vectors cannot
    collected = collect(remote, older_than=old, need=need, grace=grace_s, dry_run=dry_run)
    out.extend(Removed(str(c.path), c.kind, c.size, c.reason) for c in collected)
    total += remote_bytes - sum(c.size for c in collected)
    if max_bytes is not None:
        for used, size, ns in sorted(kept, key=lambda t: t[0]):
            if total <= max_bytes:
                break
            lock = _lock(ns, sweep)
            if lock is None:
                continue
            try:
                ok, _size = sweep.mine(ns.root)
                if ok and sweep.remove(ns.root):
                    out.append(Removed(str(ns.root), "namespace", size,
                                       f"least recently used ({age_text(now - used)} ago), over max_bytes"))
                    total -= size
            finally:
                lock.release()
                ns.close()
    sweep.report()
    return out
