"""Housekeeping of a cache directory: :func:`gc` (listing is :mod:`.listing`).

What :func:`gc` may delete, and what it never deletes:

* a namespace whose build lock is held (a build is running) is left alone
  entirely; :func:`gc` holds the lock itself while it works on a namespace;
* nothing of a namespace is deleted without holding its build lock, so a
  ``cached()`` call that holds it (to plan, build and open what it returns)
  never sees its namespace or parts vanish;
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
import errno
import logging
import os
import stat
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, UntrustedCacheError
from ..format import HASH_SUFFIX
from ..fs import (
    ExclusiveLock,
    Trust,
    age_text,
    delete_tree,
    discard_tree,
    disk_usage,
    parse_temp,
    resolve_trust,
    temp_path,
    try_exclusive,
    user_name,
)
from ..remote import NodeCache, Removed, collect
from ..writer import collect_debris
from .listing import last_used, mtime, namespaces
from .mirror import POINTER_SUFFIX
from .namespace import Manifest, Namespace
from .remote_tools import gc_remote

logger = logging.getLogger("tensorstore_cache")

__all__ = ["Removed", "gc"]


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
        self.denied: list[tuple[str, int, OSError]] = []

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
        aside = temp_path(path, "gc")
        if path.is_dir() and not path.is_symlink():
            error = delete_tree(path, aside=aside)
        else:
            try:
                path.unlink()
                error = None
            except FileNotFoundError:
                error = None
            except OSError as exc:
                error = exc
        if error is not None:
            self.deny(path, error, aside)
        return error is None

    def deny(self, path: Path, error: OSError, aside: Path | None = None) -> None:
        """Count ``path`` as kept: the system refused to delete it (``error``)."""
        size = disk_usage(path) or (disk_usage(aside) if aside is not None else 0)
        self.denied.append((str(path), size, error))

    def report(self) -> None:
        """Log, once, what was kept because of its owner or could not be deleted, and why."""
        if self.kept:
            names = sorted({user_name(u) for _p, _s, owners in self.kept for u in owners})
            logger.warning(
                "gc kept %d item(s) of other users (%s)%s; all_users=True (--all-users) "
                "removes them where the system allows", len(self.kept), ", ".join(names),
                _mib(sum(size for _p, size, _o in self.kept)),
            )
        refused = [(p, size, e) for p, size, e in self.denied if e.errno in _DENIED]
        failed = [(p, size, e) for p, size, e in self.denied if e.errno not in _DENIED]
        if refused:
            logger.warning(
                "gc could not delete %d item(s)%s that the system does not let this user "
                "delete (e.g. %s: %s); run gc as their owner or as root", len(refused),
                _mib(sum(size for _p, size, _e in refused)), refused[0][0],
                refused[0][2].strerror or refused[0][2],
            )
        if failed:
            logger.warning(
                "gc could not delete %d item(s)%s (e.g. %s: %s); the next gc tries again",
                len(failed), _mib(sum(size for _p, size, _e in failed)), failed[0][0],
                failed[0][2].strerror or failed[0][2],
            )


_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _mib(size: int) -> str:
    """``", 12.0 MiB"``; empty when nothing could be counted (files this user may not list)."""
    return f", {size / (1 << 20):.1f} MiB" if size else ""


def _tidy(ns: Namespace, grace: float, now: float, sweep: _Sweep) -> list[Removed]:
    """Collect debris, unreferenced parts and old manifests of one (locked) namespace."""
    out: list[Removed] = []
    try:
        manifest = ns.current()
    except (CorruptStoreError, UntrustedCacheError):
        return out  # never guess what a damaged or untrusted manifest referenced
    live = set(manifest.parts) if manifest else set()
    since = mtime(manifest.path) if manifest else 0.0
    try:
        entries = sorted(ns.parts_dir.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            _tidy_temp(entry, grace, now, sweep, out)
        elif name.endswith((HASH_SUFFIX, POINTER_SUFFIX)):
            part, _dot, suffix = name.rpartition(".")
            if part not in live and not (ns.parts_dir / part).exists() and now - mtime(entry) > grace:
                ok, size = sweep.mine(entry)
                what = ("hash file of a removed part" if f".{suffix}" == HASH_SUFFIX
                        else "pointer of a part no longer current")
                if ok and sweep.remove(entry):
                    out.append(Removed(str(entry), "part", size, what))
        elif name not in live and entry.is_dir():
            _tidy_part(ns, entry, now - max(mtime(entry), since), grace, sweep, out)
    _tidy_manifests(ns, manifest, grace, now, sweep, out)
    return out


def _tidy_temp(entry: Path, grace: float, now: float, sweep: _Sweep, out: list[Removed]) -> None:
    """A builder's temporary directory (debris of a dead build) or what a gc renamed aside."""
    temp = parse_temp(entry.name)
    if temp is not None and temp.kind != "gc":  # a builder's temporary directory
        before = disk_usage(entry)
        if sweep.dry_run:
            if now - mtime(entry) > grace and sweep.mine(entry)[0]:
                out.append(Removed(str(entry), "debris", before, "left by a builder"))
            return
        collect_debris(entry.parent / temp.target, max_age_s=grace, any_owner=sweep.all_users)
        if not entry.exists():
            out.append(Removed(str(entry), "debris", before, "left by a dead builder"))
    elif (temp is not None and not sweep.dry_run and temp.stale(now - mtime(entry), grace)
          and sweep.mine(entry)[0]):
        discard_tree(entry)  # what a gc renamed aside


def _tidy_part(
    ns: Namespace, entry: Path, idle: float, grace: float, sweep: _Sweep, out: list[Removed]
) -> None:
    """A part the current manifest does not reference: removed with its hash file once idle
    for ``grace`` seconds, unless a process maps it."""
    if idle <= grace:
        return
    free, fd = try_exclusive(entry / "zarr.json")
    if not free and (entry / "zarr.json").exists():
        return  # a process maps it
    try:
        side = ns.parts_dir / (entry.name + HASH_SUFFIX)
        ok, size = sweep.mine(entry)
        if not ok:
            return
        size += disk_usage(side)
        if sweep.remove(entry):
            out.append(Removed(str(entry), "part", size, f"not current for {age_text(idle)}, unused"))
            if not sweep.dry_run and side.exists() and sweep.mine(side)[0]:
                sweep.remove(side)
    finally:
        if fd is not None:
            os.close(fd)


def _tidy_manifests(
    ns: Namespace, manifest: Manifest | None, grace: float, now: float, sweep: _Sweep,
    out: list[Removed],
) -> None:
    """Superseded manifests, and stale temporary files of the manifests and of the namespace."""
    dry_run = sweep.dry_run
    if manifest is not None:
        for gen in ns.generations():
            path = ns.manifest_path(gen)
            if gen < manifest.generation and now - mtime(path) > grace:
                ok, size = sweep.mine(path)
                if ok and sweep.remove(path):
                    out.append(Removed(str(path), "manifest", size, "superseded"))
    with contextlib.suppress(OSError):
        for tmp in ns.manifests_dir.iterdir():
            old = tmp.name.startswith(".") and now - mtime(tmp) > grace
            if old and not dry_run and sweep.mine(tmp)[0]:
                sweep.remove(tmp)
    with contextlib.suppress(OSError):
        for tmp in ns.root.iterdir():  # namespace.json, a lock file or a directory being made
            temp = parse_temp(tmp.name)
            stale = temp is not None and temp.stale(now - mtime(tmp), grace)
            if stale and not dry_run and sweep.mine(tmp)[0]:
                sweep.remove(tmp)


def _sweep_namespace(
    ns: Namespace, old: float | None, grace: float, now: float, sweep: _Sweep,
    out: list[Removed],
) -> tuple[float, int, Namespace] | None:
    """Under its lock, delete a namespace unused for ``old`` seconds, or tidy it.

    Returns when it was last used, its size and itself if it is kept; None if
    it went, or a build holds its lock.
    """
    lock = _lock(ns, sweep)
    if lock is None:
        return None
    try:
        used = last_used(ns)
        if old is not None and now - used > old:
            ok, size = sweep.mine(ns.root)
            if ok:
                if sweep.remove(ns.root):
                    out.append(Removed(str(ns.root), "namespace", size,
                                       f"unused for {age_text(now - used)}"))
                return None
        out.extend(_tidy(ns, grace, now, sweep))
        return used, disk_usage(ns.root), ns
    finally:
        lock.release()
        ns.close()


def _lock(ns: Namespace, sweep: _Sweep) -> ExclusiveLock | None:
    """The namespace's lock, taken for ``gc``; None if a build holds it or it cannot be opened.

    A lock this user may not use (another user's namespace) leaves the
    namespace alone: counted as kept, or with ``all_users`` retried without
    the owner rule and, if the system refuses that too, counted as not deletable.
    """
    lock = ExclusiveLock(ns.lock_path, what="gc", trust=ns.trust)
    try:
        got = lock.try_acquire()
    except FileNotFoundError:
        return None  # removed meanwhile (by another gc)
    except OSError:  # UntrustedCacheError included
        if not sweep.all_users:
            sweep.mine(ns.root)  # counted as kept if others own any of it
            return None
        lock = ExclusiveLock(ns.lock_path, what="gc", trust=Trust.explicit(warn=False))
        try:
            got = lock.try_acquire()
        except FileNotFoundError:
            return None
        except OSError as exc:
            sweep.deny(ns.root, exc)
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
    remote: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[Removed]:
    """Delete what a cache directory no longer needs (or, with ``remote``, a prefix shared by
    ``cached(remote=...)``).

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
    remote
        Collect this remote prefix instead of the cache directory (never
        automatically, and never ``$TSC_REMOTE``): the parts that the current
        generation of a namespace does not name, out of use for
        ``older_than`` (required), old leases and store probes. Never a
        manifest, nor a part the current generation names. Ages compare the
        store's timestamps with this machine's clock. Only ``older_than``,
        ``dry_run`` and ``storage_options`` apply.
    storage_options
        With ``remote``: options of its fsspec filesystem (credentials, ...).

    Returns
    -------
    list of Removed
        What was deleted (or would be), with its size and the reason.

    Examples
    --------
    >>> from datetime import timedelta
    >>> _ = tsc.cached(paths, progress=False)
    >>> tsc.gc(older_than=timedelta(days=30))  # nothing is that old
    []
    >>> [(r.kind, r.reason) for r in tsc.gc(max_bytes=0, dry_run=True)]  # doctest: +ELLIPSIS
    [('namespace', 'least recently used (... s ago), over max_bytes')]
    >>> len(tsc.list_caches())  # a dry run deletes nothing
    1
    """
    old = _seconds(older_than, "older_than")
    if remote is not None:
        return gc_remote(remote, storage_options, old, max_bytes=max_bytes, dry_run=dry_run)
    grace_s = _seconds(grace, "grace") or 0.0
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, got {max_bytes!r}")
    trust = resolve_trust(share_with)
    root = config.cache_root(cache_dir)
    now = time.time()
    sweep = _Sweep(all_users=all_users, dry_run=dry_run)
    out: list[Removed] = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():  # namespaces a gc renamed aside and did not finish, ...
            temp = parse_temp(entry.name)
            trash = temp is not None and temp.stale(now - mtime(entry), grace_s)
            if trash and not dry_run and sweep.mine(entry)[0]:
                discard_tree(entry)
    kept = [k for ns in namespaces(root, trust)
            if (k := _sweep_namespace(ns, old, grace_s, now, sweep, out)) is not None]
    remote = root / "remote"
    total = sum(size for _used, size, _ns in kept)
    if dry_run:
        total -= sum(r.bytes for r in out if r.kind != "namespace")
    remote_bytes = NodeCache(remote).scan_only().total
    need = 0 if max_bytes is None else total + remote_bytes - max_bytes
    # remote copies go first: they can be downloaded again, a namespace's vectors cannot
    collected = collect(remote, older_than=old, need=need, grace=grace_s, dry_run=dry_run)
    out.extend(collected)
    total += remote_bytes - sum(r.bytes for r in collected)
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
