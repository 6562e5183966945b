"""Shards on demand: fetching a remote store's data files into the node cache as they are read.

A store opened from a URL has its metadata and index in the node cache
(:func:`~tensorstore_cache.remote.fetch.fetch_store`, with the offsets and
shapes of ragged fields); :class:`NodeShards` makes each data file present
the first time a row of it is read. Data files are the shards of fixed fields
(``vectors`` in format 1) and the ``values`` chunks of ragged and text fields,
named by their id ``k``, their position in
:func:`~tensorstore_cache.format.metadata.fetched_files` (shard ``k`` of the
vectors has id ``k``). Below, "shard ``k``" is the file of id ``k``. For each
missing shard ``k``:

1. threads of this process asking for ``k`` at once share one download (a
   future per shard);
2. the process *holds* ``k`` (a shared byte-range lock in ``<version>.holds``,
   see :mod:`tensorstore_cache.fs.ranges`), so no evictor deletes it while it
   is mapped, then looks for the file: present, it is a hit;
3. else it takes the shard's download lock (exclusive, waiting: processes of
   the node asking for ``k`` at once download it once), looks again, reserves
   room under the cap (evicting least recently used shards nobody holds),
   downloads it with one ranged request into a hidden temporary file,
   checks its size and XXH3-128 against the group metadata, fsyncs it and
   publishes it by ``rename``.

A process killed at any moment leaves at most a hidden partial file and no
lock (the kernel drops both locks): the next reader downloads the shard
again and collects the debris. A shard whose bytes do not match is never
kept: :class:`~tensorstore_cache.errors.StoreReplacedError` if the remote
group ``zarr.json`` changed meanwhile, :class:`~tensorstore_cache.errors.
CorruptStoreError` naming the object URL otherwise.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from ..errors import (
    CacheLimitWarning,
    CorruptStoreError,
    StoreNotFoundError,
    StoreReplacedError,
    warn_once,
)
from ..format import GroupMetadata, fetched_files
from ..fs import RangeHolds, Trust, collect_temps, fsync_dir
from ..reader import FetchStats
from .fetch import read_group
from .node_cache import NodeCache, requested_cap
from .urls import filesystem, version_name

__all__ = ["NodeShards"]

#: Memory of the shards one process downloads at once (each is held whole while checked).
_IN_FLIGHT_BYTES = 256 << 20
#: Pause before the one retry of a shard that did not match (the store may be mid-upload).
_RETRY_S = 0.5


class _NoRoomError(Exception):
    """A prefetch found no room under the cap (nothing is evicted to prefetch)."""


_live: weakref.WeakSet[NodeShards] = weakref.WeakSet()
def _warn_once(root: Path, what: str, message: str) -> None:
    warn_once(("node-shards", str(root), what), message, CacheLimitWarning, stacklevel=5)


class NodeShards:
    """The shard supply of one open version of a remote store (a reader's ``ShardSupply``).

    Parameters
    ----------
    url
        The store's URL (objects are ``<url>/<relative path>``).
    local
        Its version directory in the node cache (metadata and index present).
    meta
        Its metadata (read once, by the segment that maps it).
    holds
        This process's holds on the version, its version byte held already
        (taken before the version was read: an evictor deletes no version a
        process holds); closed with the supply.
    storage_options
        Options of the fsspec filesystem.
    max_bytes
        This process's cap of the node cache (``None``: only ``$TSC_CACHE_MAX_BYTES``
        or a cap recorded by another process applies).
    trust
        The rules of the cache directory (default: private): the modes of the
        shards, lock and holds files it creates, for every user of a shared cache.
    """

    def __init__(
        self,
        url: str,
        local: Path,
        meta: GroupMetadata,
        *,
        holds: RangeHolds,
        storage_options: Mapping[str, Any] | None = None,
        max_bytes: int | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.local = local
        self.version = local.name
        self._options = dict(storage_options or {})
        self.cache = NodeCache(local.parent.parent, trust)
        self.holds = holds
        self.spec, self.files = meta.spec, meta.files
        self.rels = fetched_files(self.spec)
        """The store-relative path of every data file, by id."""
        self.count = len(self.rels)
        requested = requested_cap(max_bytes)
        self.cap, by = self.cache.limit(requested)
        if requested is not None and self.cap is not None and self.cap < requested:
            _warn_once(self.cache.root, "cap", (
                f"the node cache {self.cache.root} keeps its cap of {self.cap} bytes (set by "
                f"{by}), smaller than the {requested} asked for: the smallest cap wins; delete "
                f"{self.cache.root / 'limit.json'} to lift it"))
        with contextlib.suppress(OSError):
            os.utime(self.holds.path)  # the version's last use, for eviction
        self._largest = max((self.files[rel][0] for rel in self.rels), default=1) or 1
        self.threads = max(2, min(8, _IN_FLIGHT_BYTES // self._largest))
        self.stats = FetchStats(cap=self.cap)
        self._fetched: set[int] = set()
        self._reset()
        _live.add(self)

    def _reset(self) -> None:
        """Fresh per-process state (also in a forked child: no threads or futures of the parent)."""
        self._lock = threading.Lock()
        self._inflight: dict[int, Future[None]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._fs: tuple[int, Any, str] | None = None
        self._stop = threading.Event()

    def _filesystem(self) -> tuple[Any, str]:
        fs = self._fs
        if fs is None or fs[0] != os.getpid():  # event loops (s3fs) do not survive fork
            fsys, root = filesystem(self.url, self._options)
            fs = self._fs = (os.getpid(), fsys, root)
        return fs[1], fs[2]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tsc-fetch")
            return self._pool

    def object_url(self, rel: str) -> str:
        """URL of the remote object ``rel`` of this store."""
        return f"{self.url}/{rel}"

    def path(self, k: int) -> Path:
        """Where the data file of id ``k`` lives in the node cache."""
        return self.local / self.rels[k]

    # -- the reader's interface ------------------------------------------------

    def ensure(self, shards: Sequence[int]) -> None:
        """Hold every shard of ``shards`` and make sure it is here, fetching missing ones at once.

        Holds are kept until :meth:`close` (the reader maps what it asked for).
        """
        futures: list[Future[None]] = []
        held: list[int] = []
        try:
            for k in shards:
                self.holds.hold(k)
                held.append(k)
                if self._present(k):
                    self.stats.hits += 1
                    continue
                futures.append(self._submit(k, evict=True))
            for fut in futures:
                fut.result()
        except BaseException:
            for k in held:
                self.holds.release(k)
            raise

    def release(self, k: int) -> None:
        """Shard ``k`` is no longer mapped by the reader: give back one hold."""
        with contextlib.suppress(OSError):
            os.utime(self.path(k))  # its last use, for eviction
        self.holds.release(k)

    @property
    def budget(self) -> int | None:
        """Shards a reader keeps mapped at once under the cap (None: uncapped, no limit).

        A quarter of the shards the cap holds (at least 1): the rest of the cap is
        left to other processes and to the shards being fetched.
        """
        if self.cap is None:
            return None
        return max(1, self.cap // (4 * self._largest))

    def close(self) -> None:
        """The store is closed: stop prefetching, drop every hold."""
        self._stop.set()
        for k in self.holds.held:
            with contextlib.suppress(OSError):
                os.utime(self.path(k))  # last use, for eviction
        self.holds.close()
        with contextlib.suppress(OSError):
            os.utime(self.holds.path)

    # -- prefetch ----------------------------------------------------------------

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        """Fetch ``shards`` ahead of reads, a few at a time; never evicts to make room.

        Returns a future of the number of shards downloaded; without
        ``background`` it is done when this returns (errors are raised).
        """
        done: Future[int] = Future()
        stop = self._stop

        def run() -> None:
            fetched = 0
            window = max(1, self.threads // 2)  # leave threads to on-demand reads
            pending: list[tuple[int, Future[None]]] = []
            skipped = 0

            def settle(k: int, fut: Future[None]) -> None:
                nonlocal fetched, skipped
                try:
                    fut.result()
                    fetched += 1
                except _NoRoomError:
                    skipped += 1
                finally:
                    self.holds.release(k)

            try:
                for k in shards:
                    if stop.is_set():
                        break
                    self.holds.hold(k)
                    if self._present(k):
                        self.holds.release(k)
                        continue
                    pending.append((k, self._submit(k, evict=False)))
                    while len(pending) >= window:
                        settle(*pending.pop(0))
                while pending:
                    settle(*pending.pop(0))
                if skipped:
                    _warn_once(self.cache.root, "prefetch", (
                        f"prefetch left {skipped} shards of {self.url} unfetched: they do not "
                        f"fit under the node cache's cap of {self.cap} bytes"))
                done.set_result(fetched)
            except BaseException as exc:
                for k, _fut in pending:
                    self.holds.release(k)
                done.set_exception(exc)

        if background:
            threading.Thread(target=run, name="tsc-prefetch", daemon=True).start()
        else:
            run()
            done.result()
        return done

    # -- fetching ------------------------------------------------------------------

    def _submit(self, k: int, *, evict: bool) -> Future[None]:
        with self._lock:
            fut = self._inflight.get(k)
            if fut is None:
                fut = self._inflight[k] = Future()
                start = True
            else:
                start = False
        if start:
            self._executor().submit(self._run, k, evict, fut)
        return fut

    def _run(self, k: int, evict: bool, fut: Future[None]) -> None:
        try:
            self._fetch(k, evict=evict)
        except BaseException as exc:
            fut.set_exception(exc)
        else:
            fut.set_result(None)
        finally:
            with self._lock:
                if self._inflight.get(k) is fut:
                    del self._inflight[k]

    def _present(self, k: int) -> bool:
        rel = self.rels[k]
        try:
            st = os.stat(self.local / rel)
        except FileNotFoundError:
            return False
        if st.st_size != self.files[rel][0]:
            return False  # the reader's own size check names it if it stays so
        with contextlib.suppress(OSError):
            os.utime(self.local / rel)  # its last use, for eviction
        return True

    def _fetch(self, k: int, *, evict: bool) -> None:
        rel = self.rels[k]
        size, digest = self.files[rel]
        with self.holds.fetching(k):
            if self._present(k):
                self.stats.hits += 1
                return
            collect_temps(self.local.parent, 24 * 3600.0, target=f"{self.version}-{k}",
                          kind="fetch")
            for attempt in range(2):
                found = self._download(k, rel, size, digest, evict=evict)
                if found is None:
                    return
                self._check_replaced(rel, found)
                if attempt == 0:
                    time.sleep(_RETRY_S)  # a store being uploaded right now: look once more
            url = self.object_url(rel)
            raise CorruptStoreError(
                f"{url}: {found}; the remote store is damaged - rebuild it or upload it again "
                "(nothing of it was kept in the node cache)", url)

    def _download(self, k: int, rel: str, size: int, digest: str, *, evict: bool) -> str | None:
        """Download shard ``k`` and publish it; return None, or what was wrong with its bytes."""
        tmp, over = self.cache.reserve(self.local, k, size, self.cap, evict=evict)
        if tmp is None:
            raise _NoRoomError
        if over > 0:
            _warn_once(self.cache.root, "over", (
                f"the node cache {self.cache.root} is {over} bytes over its cap of {self.cap}: "
                "every other shard in it is mapped by a live process (it shrinks back as they "
                "close their stores); raise max_bytes or open fewer stores at once"))
        published = False
        try:
            fs, root = self._filesystem()
            try:
                data = fs.cat_file(f"{root}/{rel}", start=0, end=size + 1)
            except FileNotFoundError:
                return "missing"
            if len(data) != size:
                return f"{len(data)}{'+' if len(data) > size else ''} bytes, the store records {size}"
            if xxhash.xxh3_128_hexdigest(data) != digest:
                return "content differs from its recorded XXH3-128"
            fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            final = self.local / rel
            self.cache.publish(tmp, final, self.cap)
            published = True
            fsync_dir(final.parent)
        finally:
            if not published:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                self.cache.unreserve(size, self.cap)
        self._count(k, size)
        return None

    def _count(self, k: int, size: int) -> None:
        with self._lock:
            self.stats.shards += 1
            self.stats.bytes += size
            if k in self._fetched:
                self.stats.refetched += 1
                again = self.stats.refetched * size
                if self.cap is not None and again > self.cap:
                    _warn_once(self.cache.root, "thrash", (
                        f"this process downloaded {self.stats.refetched} shards of {self.url} "
                        f"again after they were evicted ({again} bytes, more than the cap of "
                        f"{self.cap}; {len(self._fetched)} distinct shards of {size} bytes read): "
                        "the rows it reads span more than the cap holds. Raise max_bytes, read "
                        "rows in shard order, or store uint8"))
            self._fetched.add(k)

    def _check_replaced(self, rel: str, found: str) -> None:
        """Raise :class:`StoreReplacedError` if the remote store is no longer the version opened."""
        fs, root = self._filesystem()
        try:
            now: str | None = version_name(read_group(fs, root, self.url))
        except StoreNotFoundError:
            now = None
        if now != self.version:
            url = self.object_url(rel)
            raise StoreReplacedError(
                f"the store at {self.url} was replaced after this process opened it ({url} is "
                f"now {found}, and this node had not fetched it yet); reopen it with "
                f"open_store({self.url!r})", url)


def _reset_in_child() -> None:
    for shards in list(_live):
        shards._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)

