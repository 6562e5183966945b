"""The node cache's size cap: usage, least-recently-used eviction of shards nobody maps.

Layout under ``<cache_dir>/remote``::

    limit.json                      the smallest max_bytes any process asked for
    evict.lock                      flock: one process at a time reserves room
    usage                           8-byte ledger of the bytes below
    <url-dir>/<version>/            metadata, index and the data files fetched so far
    <url-dir>/<version>.holds       readers' holds (see fs/ranges.py)
    <url-dir>/.<version>-<k>.tsc-fetch-<host>-<pid>-<token>    a shard download in progress

Usage counts every file: metadata, index, shards, and downloads in progress
at their full size (reserved with ``posix_fallocate`` before the first byte
arrives). Candidates for eviction, least recently used first (a shard's
mtime is touched when a process maps it or lets go of it): shards no
process holds, and whole versions no process has open. "Shards" are every
data file fetched on demand, by id (:func:`~tensorstore_cache.format.metadata.fetched_files`):
the shards of ``vectors/c`` in format 1, where the id is the shard number;
in a store of records, the shards and ragged ``values`` chunks of each field,
whose ids the version's group metadata gives. A shard a live process maps is
never evicted: if nothing else can go, the cache grows past its cap (the
caller warns once) rather than breaking a reader.

Scans, reservations, evictions and the rename that publishes a shard all
happen under ``evict.lock`` in a capped cache, so a scan is a consistent
snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..format import FIELDS, GROUP, VECTORS, GroupMetadata, fetched_dirs
from ..fs import (
    ExclusiveLock,
    TempName,
    Trust,
    age_text,
    create_file,
    disk_usage,
    make_dir,
    parse_temp,
    read_json,
    remove_tree,
    temp_path,
    try_lock_range,
    unlock_range,
)

__all__ = ["Entry", "NodeCache", "Removed", "Usage", "collect", "requested_cap"]

_LIMIT = "limit.json"
_EVICT_LOCK = "evict.lock"
_LEDGER = "usage"
HOLDS_SUFFIX = ".holds"
#: Where locks do not work, evict only what nobody touched for this long.
_UNLOCKED_GRACE = 60.0


def requested_cap(max_bytes: int | None) -> int | None:
    """The cap this process asks for: the smaller of ``max_bytes`` and ``$TSC_CACHE_MAX_BYTES``."""
    caps = [] if max_bytes is None else [int(max_bytes)]
    env = os.environ.get(config.MAX_BYTES_ENV, "").strip()
    if env:
        try:
            caps.append(int(env))
        except ValueError:
            raise ValueError(
                f"{config.MAX_BYTES_ENV}={env!r} is not a number of bytes; set it to an "
                "integer such as 50000000000, or unset it"
            ) from None
    for cap in caps:
        if cap <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes, got {cap}")
    return min(caps) if caps else None


@dataclass(frozen=True, slots=True)
class Entry:
    """One evictable thing: shard ``k`` of a version, or (``k`` None) a whole version."""

    last_used: float
    size: int
    version: Path
    k: int | None
    path: Path


@dataclass(slots=True)
class Usage:
    """A scan of the node cache."""

    total: int = 0
    entries: list[Entry] = field(default_factory=list)


def partial_path(version: Path, k: int) -> Path:
    """A fresh name for a download of shard ``k`` of ``version``, owned by this process."""
    return temp_path(version.with_name(f"{version.name}-{k}"), "fetch")


class NodeCache:
    """The shared node cache under ``root`` (``<cache_dir>/remote``)."""

    def __init__(self, root: Path, trust: Trust | None = None) -> None:
        self.root = root
        self.trust = trust if trust is not None else Trust.private()
        """The cache directory's rules: the modes of what is created here."""
        self._trusted = False  # the ledger is trusted after this process's first scan
        self.scans = 0

    def _make_root(self) -> None:
        """Create the node cache directory (and those above it) with the cache's modes."""
        self.make_dirs(self.root)

    def make_dirs(self, path: Path) -> None:
        """Create ``path`` and its missing parents with the cache's modes."""
        missing = []
        while not path.is_dir():
            missing.append(path)
            if path.parent == path:
                break
            path = path.parent
        for d in reversed(missing):
            make_dir(d, self.trust)

    def _shared_file(self, path: Path) -> int:
        """Open (creating it with the modes every user of the cache may write) a lock file."""
        return create_file(path, self.trust, flags=os.O_RDWR, kind="member-write", exclusive=False)

    # -- the cap -----------------------------------------------------------

    def limit(self, requested: int | None) -> tuple[int | None, str | None]:
        """Return the cap in force (the smallest ever asked for) and who set it.

        A smaller ``requested`` cap is recorded (replacing the file atomically,
        re-reading it and keeping the smallest when two processes race).
        """
        path = self.root / _LIMIT
        recorded: int | None = None
        by: str | None = None
        with contextlib.suppress(OSError, ValueError):
            raw = json.loads(path.read_bytes()[:4096])
            value = raw.get("max_bytes") if isinstance(raw, dict) else None
            if type(value) is int and value > 0:
                recorded, by = value, str(raw.get("set_by", "?"))
        if requested is None or (recorded is not None and recorded <= requested):
            return recorded, by
        self._make_root()
        me = f"pid {os.getpid()} on {socket.gethostname()}"
        tmp = temp_path(path, "new")
        fd = create_file(tmp, self.trust, kind="data")
        try:
            os.write(fd, json.dumps({"max_bytes": requested, "set_by": me, "unix": time.time()}).encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        again, who = self.limit(None)
        if again is not None and again > requested:  # a larger cap won a race: record ours again
            return self.limit(requested)
        return again, who

    # -- usage -------------------------------------------------------------

    def scan_only(self) -> Usage:
        """Measure every file under the cache, removing nothing."""
        return self.scan(collect=False)

    def scan(self, *, collect: bool = True) -> Usage:
        """Measure every file under the cache; remove downloads of dead processes."""
        usage = Usage()
        try:
            stores = list(os.scandir(self.root))
        except FileNotFoundError:
            return usage
        for store in stores:
            if not store.is_dir(follow_symlinks=False) or store.name.startswith("."):
                continue
            for entry in os.scandir(store.path):
                name = entry.name
                if name.startswith("."):
                    temp = parse_temp(name)
                    if collect and temp is not None and temp.owner_dead():
                        remove_tree(Path(entry.path))
                    else:
                        usage.total += disk_usage(Path(entry.path))
                    continue
                if entry.is_dir(follow_symlinks=False):
                    self._scan_version(Path(entry.path), usage)
        return usage

    def _scan_version(self, version: Path, usage: Usage) -> None:
        index_bytes = 0
        records = _record_dirs(version) if os.path.isdir(version / FIELDS) else None
        for dirpath, dirs, files in os.walk(version):
            if records is None:
                first = 0 if (os.path.basename(dirpath) == "c" and
                              os.path.basename(os.path.dirname(dirpath)) == VECTORS) else None
            else:
                first = records.get(os.path.relpath(dirpath, version).replace(os.sep, "/"))
            if first is not None:
                dirs.clear()
                self._scan_shards(version, Path(dirpath), usage, first)
                continue
            for name in files:
                with contextlib.suppress(OSError):
                    index_bytes += os.lstat(os.path.join(dirpath, name)).st_size
        try:
            used = version.with_name(version.name + HOLDS_SUFFIX).stat().st_mtime
        except OSError:  # a copy made before holds files were created with it
            try:
                used = version.stat().st_mtime
            except OSError:
                used = 0.0
        usage.total += index_bytes
        usage.entries.append(Entry(used, index_bytes, version, None, version))

    @staticmethod
    def _scan_shards(version: Path, cdir: Path, usage: Usage, first: int = 0) -> None:
        """The data files of one array's ``c`` directory: file ``k`` has id ``first + k``."""
        depth = None
        for kent in os.scandir(cdir):
            if not kent.name.isdigit():
                continue
            if depth is None:
                depth, p = 0, kent.path
                while os.path.isdir(p):
                    p = os.path.join(p, "0")
                    depth += 1
            leaf = os.path.join(kent.path, *(["0"] * depth))
            try:
                st = os.lstat(leaf)
            except OSError:
                continue
            usage.total += st.st_size
            usage.entries.append(
                Entry(st.st_mtime, st.st_size, version, first + int(kent.name), Path(leaf)))

    # -- making room -------------------------------------------------------

    @contextlib.contextmanager
    def _evict_lock(self) -> Iterator[None]:
        with ExclusiveLock(self.root / _EVICT_LOCK, prepare=self._make_root, what="evict",
                           trust=self.trust) as lock:
            lock.acquire()
            yield

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[int]:
        """The usage ledger's descriptor, under ``evict.lock``."""
        with self._evict_lock():
            fd = self._shared_file(self.root / _LEDGER)
            try:
                yield fd
            finally:
                os.close(fd)

    @staticmethod
    def _read(fd: int) -> int | None:
        raw = os.pread(fd, 8, 0)
        return int.from_bytes(raw, "little") if len(raw) == 8 else None

    @staticmethod
    def _write(fd: int, value: int) -> None:
        os.pwrite(fd, max(0, value).to_bytes(8, "little"), 0)

    def reserve(
        self, version: Path, k: int, nbytes: int, cap: int | None, *, evict: bool = True
    ) -> tuple[Path | None, int]:
        """Make room for ``nbytes`` under ``cap`` and create the download file of shard ``k``.

        Returns
        -------
        path : Path or None
            The download file (``nbytes`` long, allocated); None when
            ``evict`` is false and the shard does not fit.
        over : int
            By how many bytes the cache exceeds ``cap`` with this download
            (0 normally; positive when every other shard is mapped).
        """
        tmp = partial_path(version, k)
        over = 0
        with contextlib.ExitStack() as stack:
            if cap is not None:
                fd = stack.enter_context(self._ledger())
                total = self._read(fd) if self._trusted else None
                if total is None or total + nbytes > cap:
                    usage = self.scan()
                    self.scans += 1
                    total = usage.total
                    self._trusted = True
                    if total + nbytes > cap:
                        if not evict:
                            return None, 0
                        slack = min(cap // 8, 8 * nbytes)
                        need = total + nbytes - (cap - slack)
                        total -= sum(r.bytes for r in self._evict(usage, need, keep=(version, k)))
                        over = total + nbytes - cap
                self._write(fd, total + nbytes)
            out = create_file(tmp, self.trust, kind="data")
            try:
                if nbytes:
                    os.posix_fallocate(out, 0, nbytes)
            except BaseException:
                os.close(out)
                os.unlink(tmp)
                raise
            os.close(out)
        return tmp, max(0, over)

    def publish(self, tmp: Path, final: Path, cap: int | None) -> None:
        """Rename a finished download to its shard's name."""
        with self._evict_lock() if cap is not None else contextlib.nullcontext():
            self.make_dirs(final.parent)
            os.rename(tmp, final)

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` moved into the cache without a reservation (a builder's own store)
        in the usage ledger, if there is one (only a capped cache keeps it)."""
        if not (self.root / _LEDGER).exists():
            return
        with self._ledger() as fd:
            total = self._read(fd)
            if total is not None:
                self._write(fd, total + nbytes)

    def unreserve(self, nbytes: int, cap: int | None) -> None:
        """Give back a reservation whose download failed (its file already removed)."""
        if cap is None:
            return
        with self._ledger() as fd:
            total = self._read(fd)
            if total is not None:
                self._write(fd, total - nbytes)

    def _evict(
        self, usage: Usage, need: int, keep: tuple[Path, int] | None, *, dry_run: bool = False
    ) -> list[Removed]:
        """Delete least recently used unheld entries until ``need`` bytes are freed.

        ``keep`` is ``(version, k)``: the shard being made room for, and its
        version's metadata and index, are never chosen (None: anything may go).
        Returns what went; ``need`` minus their sizes is what is left to free.
        """
        out: list[Removed] = []
        fds: dict[Path, int] = {}
        gone: set[Path] = set()  # versions removed as a whole
        now = time.time()
        try:
            for e in sorted(usage.entries, key=lambda e: e.last_used):
                if need <= 0:
                    break
                if e.version in gone or (keep is not None and e.version == keep[0]
                                         and e.k in (keep[1], None)):
                    continue
                holds = e.version.with_name(e.version.name + HOLDS_SUFFIX)
                fd = fds.get(holds)
                if fd is None:
                    try:
                        fd = fds[holds] = os.open(holds, os.O_RDWR | os.O_CLOEXEC)
                    except FileNotFoundError:
                        fd = fds[holds] = -1
                start, length = (0, 0) if e.k is None else (e.k, 1)  # length 0: the whole file
                got = try_lock_range(fd, start, length) if fd >= 0 else None
                if got is False:
                    continue  # a process maps it (or has the version open)
                if got is None and now - e.last_used < _UNLOCKED_GRACE:
                    continue
                try:
                    if e.k is None:
                        gone.add(e.version)
                        size = sum(x.size for x in usage.entries if x.version == e.version)
                        out.append(Removed(str(e.version), "remote-version", size, "least recently used"))
                        if not dry_run:
                            remove_tree(e.version)
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(holds)
                    else:
                        size = e.size
                        out.append(Removed(str(e.path), "remote-shard", size, "least recently used"))
                        if not dry_run:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(e.path)
                            _prune(e.path, e.version)
                    need -= size
                finally:
                    if got:
                        unlock_range(fd, start, length)
        finally:
            for fd in fds.values():
                if fd >= 0:
                    os.close(fd)
        return out


@dataclass(frozen=True, slots=True)
class Removed:
    """Something housekeeping deleted (or would delete, with ``dry_run``): what
    :func:`~tensorstore_cache.gc` returns, the node cache's evictions included.

    Examples
    --------
    >>> _ = tsc.cached(paths, progress=False)
    >>> [removed] = tsc.gc(max_bytes=0)
    >>> removed.kind, removed.bytes > 0, tsc.list_caches()
    ('namespace', True, [])
    """

    path: str
    """The file or directory."""
    kind: Literal["namespace", "part", "debris", "manifest", "remote-shard", "remote-version",
                  "remote-part", "remote-lease", "remote-probe"]
    """What it was (``"remote-shard"`` and ``"remote-version"``: the node cache of remote
    stores; ``"remote-part"``, ``"remote-lease"``, ``"remote-probe"``: objects of a prefix
    shared by ``cached(remote=...)``)."""
    bytes: int
    """Bytes it took on disk."""
    reason: str
    """Why it went, e.g. ``"unused for 9 days"``."""


_LEFT_BY = {"gc": "left by an interrupted removal", "fetch": "left by a dead download"}


def _partials(root: Path) -> list[tuple[Path, TempName]]:
    """Every temporary entry (a download in progress or left behind, a removal, ...) of the
    node cache and of its stores' directories."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for store in os.scandir(root):
            temp = parse_temp(store.name)
            if temp is not None:
                out.append((Path(store.path), temp))
            if not store.is_dir(follow_symlinks=False) or store.name.startswith("."):
                continue
            for entry in os.scandir(store.path):
                temp = parse_temp(entry.name)
                if temp is not None:
                    out.append((Path(entry.path), temp))
    return out


def collect(
    root: Path, *, older_than: float | None, need: int, grace: float, dry_run: bool
) -> list[Removed]:
    """Housekeeping of the node cache ``root`` (``<cache_dir>/remote``), for ``gc``.

    Removes downloads left by dead processes (and those of another host, once
    older than ``grace``), versions no process has open and unused for
    ``older_than`` seconds, then least recently used shards and closed
    versions until ``need`` bytes are freed. Never anything a live process
    maps or has open.
    """
    if not root.is_dir():
        return []  # no remote store was ever opened here: create nothing
    cache = NodeCache(root)
    out: list[Removed] = []
    now = time.time()
    with cache._ledger() as ledger:
        for path, temp in _partials(root):
            try:
                age = now - path.lstat().st_mtime
            except FileNotFoundError:
                continue
            if not temp.stale(age, grace):
                continue  # a download in progress (this host's: whatever its age)
            reason = _LEFT_BY.get(temp.kind, "left by a dead process")
            out.append(Removed(str(path), "debris", disk_usage(path), reason))
            if not dry_run:
                remove_tree(path)
        usage = cache.scan() if not dry_run else cache.scan_only()
        for e in sorted(usage.entries, key=lambda e: e.last_used):
            if e.k is not None or older_than is None or now - e.last_used <= older_than:
                continue
            freed = _probe_version(e.version)
            if freed is None:
                continue  # open in a process
            size = sum(x.size for x in usage.entries if x.version == e.version)
            out.append(Removed(str(e.version), "remote-version", size,
                                 f"unused for {age_text(now - e.last_used)}"))
            usage.entries = [x for x in usage.entries if x.version != e.version]
            need -= size
            if not dry_run:
                _drop_version(e.version, freed)
            elif freed >= 0:
                os.close(freed)
        if need > 0:
            out.extend(cache._evict(usage, need, keep=None, dry_run=dry_run))
        if not dry_run:
            cache._write(ledger, cache.scan_only().total)
    return out


def _probe_version(version: Path) -> int | None:
    """Lock a whole version's holds file if nobody has it open: its descriptor (-1: no file
    or no locks), or None if it is open somewhere."""
    holds = version.with_name(version.name + HOLDS_SUFFIX)
    try:
        fd = os.open(holds, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    got = try_lock_range(fd, 0, 0)
    if got is False:
        os.close(fd)
        return None
    if got is None:
        os.close(fd)
        return -1
    return fd


def _drop_version(version: Path, fd: int) -> None:
    """Delete a version directory and its holds file (``fd``: the whole-file lock, closed here)."""
    try:
        remove_tree(version)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(version.with_name(version.name + HOLDS_SUFFIX))
    finally:
        if fd >= 0:
            os.close(fd)


def _prune(leaf: Path, version: Path) -> None:
    """Remove the empty directories of an evicted shard, up to its array's ``c`` directory
    (the nearest one above it: the directories below are numbers)."""
    stop = leaf.parent
    while stop.name != "c" and stop != version:
        stop = stop.parent
    d = leaf.parent
    while d != stop and d.is_relative_to(stop):
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


#: The data directories of versions of stores of records, by version path (a version's
#: name is the hash of its group metadata, so what it holds never changes).
_RECORD_DIRS: dict[str, dict[str, int] | None] = {}


def _record_dirs(version: Path) -> dict[str, int] | None:
    """The ``c`` directory of every field of the record store ``version``, with the id of
    its file 0 (None if its metadata cannot be read: nothing in it is then evicted alone)."""
    key = str(version)
    if key not in _RECORD_DIRS:
        try:
            doc = read_json(version / GROUP, max_bytes=config.MAX_GROUP_JSON)
            spec = GroupMetadata.from_json(doc, str(version / GROUP)).spec
        except (CorruptStoreError, StoreNotFoundError, OSError):
            return None  # looked at again next time (e.g. a copy being removed)
        if len(_RECORD_DIRS) > 1024:
            _RECORD_DIRS.clear()
        _RECORD_DIRS[key] = fetched_dirs(spec)
    return _RECORD_DIRS[key]
