"""One published store directory, mapped: its index and its shards.

Opening maps the six small index arrays (``O(1)`` system calls, no
per-entry Python objects); shard files are mapped lazily, the first time one
of their rows is read. A store whose shard files are fetched on demand
gives a :class:`ShardSupply` at open: the segment asks it for every shard
it is about to map, all the shards of one batch at once.

Keys are found by their XXH3-64 in the sorted ``key_hash`` array, then
compared byte for byte with the stored key. A single lookup narrows the binary
search with a small table of bucket starts (the top bits of the hash), built
on the first single lookup.
"""

from __future__ import annotations

import bisect
import mmap
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError, StoreNotFoundError
from ..format.hashes import read_hashes
from ..format.metadata import (
    INDEX_ARRAYS,
    GroupMetadata,
    index_array_length,
    shard_count,
    shard_key,
)
from ..format.shard import MappedShard, map_shard_fd, open_shard
from ..fs.safe import map_file
from ..fs.trust import Trust, check_fd, open_dir, open_root
from ..remote.shards import FetchStats
from .vmap import VirtualRows, virtual_rows_supported

__all__ = ["Segment", "ShardSupply"]


class ShardSupply(Protocol):
    """Makes shard files present before a segment maps them (shards on demand)."""

    stats: FetchStats
    """What was fetched so far."""

    def ensure(self, shards: Sequence[int]) -> None:
        """Return once the files of ``shards`` are in place, complete (or raise)."""

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        """Fetch ``shards`` ahead of reads; a future of the number downloaded."""

    def release(self, k: int) -> None:
        """Shard ``k`` is no longer mapped (one :meth:`ensure` of it is given back)."""

    def close(self) -> None:
        """The segment is closed: nothing more will be asked."""


_UNREAD: Any = object()
_bisect_left = bisect.bisect_left
#: Largest bucket table of a single lookup: 2**16 starts.
_MAX_BUCKET_BITS = 16


def _ints(array: npt.NDArray[np.generic], code: Literal["Q", "q"]) -> Sequence[int]:
    """A sequence of Python ints over ``array``: a memoryview (C-speed bisect and indexing)
    on little-endian hosts, whose byte order the files share; a list elsewhere."""
    if sys.byteorder == "little":
        return array.view(np.uint8).data.cast(code)
    return list(array.tolist())


#: Query bytes compared in one vectorised step of :func:`same_bytes`: its temporaries
#: (about 17 bytes per query byte) stay below glibc's initial mmap threshold, so they
#: are reused from the heap instead of raising the threshold and growing the heap for good.
_COMPARE_BYTES = 6 << 10


def same_bytes(
    stored: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.uint64],
    stops: npt.NDArray[np.uint64],
    keys: Sequence[bytes],
) -> npt.NDArray[np.bool_]:
    """Whether ``stored[starts[i]:stops[i]] == keys[i]`` for every ``i``, vectorised.

    A gather of the candidates' stored bytes and one comparison with the keys'
    bytes per step of about :data:`_COMPARE_BYTES`: no Python object per key
    (``starts``/``stops`` are within ``stored``, checked by the caller).
    """
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    begin = starts.astype(np.int64)
    same: npt.NDArray[np.bool_] = (stops.astype(np.int64) - begin) == lengths
    if len(keys) == 0:
        return same
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_COMPARE_BYTES, int(ends[-1]), _COMPARE_BYTES))
    a = 0
    for b in [*np.unique(cuts + 1).tolist(), len(keys)]:
        if b <= a:
            continue
        part = lengths[a:b]
        query = np.frombuffer(b"".join(keys[a:b]), dtype=np.uint8)
        qstarts = np.zeros(b - a, dtype=np.int64)
        np.cumsum(part[:-1], out=qstarts[1:])
        index = np.repeat(begin[a:b] - qstarts, part)
        index += np.arange(len(query), dtype=np.int64)
        equal = np.empty(len(query) + 1, dtype=bool)
        np.equal(stored.take(index, mode="clip"), query, out=equal[:-1])
        equal[-1] = True  # a start for an empty last key; such keys fail the length check
        same[a:b] &= np.logical_and.reduceat(equal, qstarts)
        a = b
    return same


class Segment:
    """A mapped store directory.

    Parameters
    ----------
    root
        The store directory (a zarr v3 group written by this library).
    supply
        Asked for the shards about to be mapped for the first time (all the
        shards of one batch at once); their files are then checked like any
        other (size, index checksum). None: every file is already there.
    budget
        Most shards mapped at once (with a ``supply`` only). None: a shard
        stays mapped until the segment closes, and rows are views. A number:
        least recently used shards are unmapped (and given back to the
        supply) beyond it, so rows are returned as copies, never views that
        could point into a released shard; a batch spanning more shards is
        gathered in groups of ``budget`` shards.
    trust
        Whose directories and files may be read: checked on the store
        directory and every directory and file opened in it, now and when a
        shard is mapped later (see :mod:`tensorstore_cache.fs.trust`).
        Default: a store the user named (warned about if others can write it).
    parent_fd
        A checked descriptor of the directory holding the store: ``root`` is
        then opened in it by name, never through a symlink (a cache's part).
        None: ``root`` is opened by its path (it may be a symlink).
    """

    def __init__(
        self,
        root: Path,
        *,
        supply: ShardSupply | None = None,
        budget: int | None = None,
        trust: Trust | None = None,
        parent_fd: int | None = None,
    ) -> None:
        self.root = root
        self._supply = supply
        self._budget = None if supply is None or budget is None else max(1, int(budget))
        self._used: OrderedDict[int, None] = OrderedDict()  # mapped shards, LRU first (budget)
        self.trust = trust if trust is not None else Trust.explicit(root)
        """Whose files this segment reads (see :class:`~tensorstore_cache.fs.trust.Trust`)."""
        # Every file is opened relative to this descriptor, so the segment keeps
        # reading the directory it opened even if another store is renamed over
        # ``root`` later (build_store(overwrite=True)): never a mix of two stores.
        try:
            if parent_fd is None:
                self._dir_fd = open_root(root, self.trust)
            else:
                self._dir_fd = open_dir(root.name, self.trust, dir_fd=parent_fd, shown=root)
        except (FileNotFoundError, NotADirectoryError):
            raise StoreNotFoundError(f"no store at {str(root)!r}") from None
        self._close_dir = weakref.finalize(self, os.close, self._dir_fd)
        try:
            self._open(root)
        except BaseException:
            self._close_dir()
            raise

    @property
    def dir_fd(self) -> int:
        """Descriptor of the store directory this segment opened (-1 once closed)."""
        if self._dir_fd < 0:
            raise ValueError(f"store {str(self.root)!r} is closed")
        return self._dir_fd

    def _open(self, root: Path) -> None:
        meta = GroupMetadata.read(root, self._dir_fd, trust=self.trust)
        self.spec, self.files, key_bytes_len = meta.spec, meta.files, meta.key_bytes_len
        self.n = self.spec.n
        self.item_shape = self.spec.item_shape
        self.dtype: np.dtype[np.generic] = np.dtype(self.spec.dtype).newbyteorder("<")
        self.rows_per_shard = self.spec.rows_per_shard
        self._buffers: list[mmap.mmap] = []
        arrays: dict[str, npt.NDArray[np.generic]] = {}
        for name, dtype in INDEX_ARRAYS.items():
            length = index_array_length(name, self.spec, key_bytes_len)
            rel = f"{name}/c/0"
            if length == 0:
                arrays[name] = np.empty(0, dtype=np.dtype(dtype))
                continue
            item = np.dtype(dtype).itemsize
            buf = map_file(root / rel, root, self.files[rel][0], copy_on_write=False,
                           root_fd=self._dir_fd, trust=self.trust)
            if buf is None or len(buf) != length * item:
                raise CorruptStoreError(f"{root / rel} has the wrong size", str(root / rel))
            self._buffers.append(buf)
            arrays[name] = np.frombuffer(buf, np.dtype(dtype).newbyteorder("<"), length)
        self.key_hash = arrays["key_hash"]
        self.key_row = arrays["key_row"]
        self.key_offsets = arrays["key_offsets"]
        self.key_bytes = arrays["key_bytes"]
        self.source_size = arrays["source_size"]
        self.source_mtime_ns = arrays["source_mtime_ns"]
        self._hash_mv = _ints(self.key_hash, "Q")
        self._row_mv = _ints(self.key_row, "q")
        self._off_mv = _ints(self.key_offsets, "Q")
        self._kb_mv = self.key_bytes.data
        self._kb_len = len(self._kb_mv)
        self._buckets: tuple[Sequence[int], int] | None = None
        self._content_hashes: npt.NDArray[np.uint64] | None = _UNREAD
        self._shards: list[MappedShard | None] = [None] * shard_count(self.spec)
        self._lock = threading.Lock()
        self._vrows: VirtualRows | None = None
        self._all_mapped = False
        #: Every row in one contiguous copy-on-write view, once every shard is mapped
        #: (None before, and where rows cannot be mapped contiguously).
        self.all_rows: npt.NDArray[np.generic] | None = None
        self._vmapped = [False] * len(self._shards)  # shard k sits in the contiguous view
        item_nbytes = self.spec.item_nbytes
        if self.n and virtual_rows_supported(self.rows_per_shard, item_nbytes):
            try:
                self._vrows = VirtualRows(self.n, self.item_shape, self.dtype, self.rows_per_shard)
            except OSError:
                self._vrows = None

    # -- keys ---------------------------------------------------------------

    # The index arrays are checked where they are used (O(1) per lookup), not
    # at open: a damaged index raises CorruptStoreError instead of an IndexError
    # or a wrong answer, and opening stays O(1).

    def _bad_index(self, name: str, detail: str) -> CorruptStoreError:
        path = self.root / name / "c" / "0"
        return CorruptStoreError(
            f"{path}: {detail}; the store's index is damaged (run verify, then rebuild it)",
            str(path),
        )

    def _key_span(self, row: int) -> tuple[int, int]:
        off = self._off_mv
        start, stop = off[row], off[row + 1]
        if not start <= stop <= len(self._kb_mv):
            raise self._bad_index(
                "key_offsets", f"row {row} has key bytes [{start}, {stop}) outside the "
                f"{len(self._kb_mv)} stored"
            )
        return start, stop

    def key_at(self, row: int) -> bytes:
        """Return the stored key bytes of ``row``."""
        if not 0 <= row < self.n:
            raise IndexError(f"row {row} is out of range for {self.n} rows")
        start, stop = self._key_span(row)
        return bytes(self._kb_mv[start:stop])

    def _bucket_table(self) -> tuple[Sequence[int], int]:
        """Return the first position of every hash bucket, and the shift that gives a bucket."""
        bits = max(0, min(_MAX_BUCKET_BITS, self.n.bit_length() - 1))
        shift = 64 - bits
        starts = np.empty((1 << bits) + 1, dtype=np.int64)
        starts[0], starts[-1] = 0, self.n
        edges = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(shift % 64)
        starts[1:-1] = np.searchsorted(self.key_hash, edges, side="left")
        self._buckets = (_ints(starts, "q"), shift)
        return self._buckets

    def find(self, encoded: bytes, h: int) -> int:
        """Return the row of one key, or -1 (the single-lookup hot path)."""
        table, shift = self._buckets or self._bucket_table()
        bucket = h >> shift
        mv = self._hash_mv
        pos = _bisect_left(mv, h, table[bucket], table[bucket + 1])
        n, kb, off = self.n, self._kb_mv, self._off_mv
        while pos < n and mv[pos] == h:
            row = self._row_mv[pos]
            if not 0 <= row < n:
                raise self._bad_index("key_row", f"entry {pos} names row {row} of {n}")
            start = off[row]
            stop = off[row + 1]
            if not start <= stop <= self._kb_len:
                self._key_span(row)  # raises, naming the damage
            if kb[start:stop] == encoded:
                return row
            pos += 1
        return -1

    def find_many(
        self, encoded: Sequence[bytes], hashes: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.int64]:
        """Return the row of every key, -1 where absent.

        The search is vectorised, and so is the byte-for-byte comparison of
        every candidate with its stored key; only hash collisions fall back to
        a scan.
        """
        out = np.full(len(encoded), -1, dtype=np.int64)
        if self.n == 0 or len(encoded) == 0:
            return out
        pos = np.minimum(np.searchsorted(self.key_hash, hashes, side="left"), self.n - 1)
        hit = self.key_hash[pos] == hashes
        every = bool(hit.all())
        cand = np.arange(len(encoded)) if every else np.flatnonzero(hit)
        if len(cand) == 0:
            return out
        rows: npt.NDArray[np.int64] = np.asarray(
            self.key_row[pos if every else pos[cand]], dtype=np.int64
        )
        if int(rows.min()) < 0 or int(rows.max()) >= self.n:
            bad_row = int(rows[(rows < 0) | (rows >= self.n)][0])
            raise self._bad_index("key_row", f"an entry names row {bad_row} of {self.n}")
        offsets: npt.NDArray[np.uint64] = np.asarray(self.key_offsets, dtype=np.uint64)
        starts_u, stops_u = offsets[rows], offsets[rows + 1]
        if np.any(stops_u < starts_u) or int(stops_u.max()) > len(self.key_bytes):
            raise self._bad_index("key_offsets", "key offsets decrease or pass the key bytes")
        keys = encoded if every else [encoded[i] for i in cand.tolist()]
        same = same_bytes(np.asarray(self.key_bytes, dtype=np.uint8), starts_u, stops_u, keys)
        out[cand[same]] = rows[same]
        for i in cand[~same].tolist():  # hash collision (or a different key): scan
            out[i] = self.find(encoded[i], int(hashes[i]))
        return out

    def key_list(self) -> list[str]:
        """Return every key in row order (decodes all of them)."""
        offsets: npt.NDArray[np.uint64] = np.asarray(self.key_offsets, dtype=np.uint64)
        if self.n and (
            np.any(offsets[1:] <= offsets[:-1]) or int(offsets[-1]) > len(self.key_bytes)
        ):  # every key has at least one byte
            raise self._bad_index(
                "key_offsets", "key offsets do not increase or pass the key bytes"
            )
        raw = self.key_bytes.tobytes()
        if b"\x00" in raw:  # normalize_key never lets a NUL through
            raise self._bad_index("key_bytes", "a stored key contains a NUL byte")
        offs = offsets.tolist()
        return [
            raw[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(self.n)
        ]

    # -- source identity ------------------------------------------------------

    def content_hashes(self) -> npt.NDArray[np.uint64] | None:
        """Return the recorded content hash of every row (0: unknown), or None if none was recorded.

        Read once from the part's side file (see :mod:`tensorstore_cache.format.hashes`).
        """
        if self._content_hashes is _UNREAD:
            if self._dir_fd < 0:
                raise ValueError(f"store {str(self.root)!r} is closed")
            # the side file lies next to the part: in the directory that holds the one opened
            parent = os.open("..", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0),
                             dir_fd=self._dir_fd)
            try:
                if self.trust.kind != "explicit":
                    check_fd(parent, self.root.parent, self.trust)
                self._content_hashes = read_hashes(self.root, self.n, trust=self.trust,
                                                   dir_fd=parent)
            finally:
                os.close(parent)
        return self._content_hashes

    # -- vectors --------------------------------------------------------------

    def shard(self, k: int) -> MappedShard:
        """Return shard ``k``, mapping (and checking) it on first use."""
        shard = self._shards[k]
        if shard is None:
            self._map_shards([k])
            shard = self._shards[k]
            assert shard is not None
        return shard

    def _map_shards(self, ks: Sequence[int]) -> None:
        """Map the shards ``ks`` not mapped yet (their supply asked once for all of them)."""
        todo = [k for k in ks if self._shards[k] is None]
        if not todo:
            return
        if self._supply is not None:
            self._supply.ensure(todo)
        with self._lock:
            for k in todo:
                if self._shards[k] is None:
                    self._shards[k] = self._map(k)
            if self._budget is None and all(x is not None for x in self._shards):
                self._all_mapped = True
                if self._vrows is not None:  # every row in one contiguous view from now on
                    self.all_rows = self._vrows.rows

    def _map(self, k: int) -> MappedShard:
        rel = shard_key(self.spec, k)
        path = self.root / rel
        rows = min(self.rows_per_shard, self.n - k * self.rows_per_shard)
        if self._dir_fd < 0:
            raise ValueError(f"store {str(self.root)!r} is closed")
        try:
            fd, offsets = open_shard(
                path,
                self.root,
                rows=rows,
                rows_per_shard=self.rows_per_shard,
                item_nbytes=self.spec.item_nbytes,
                expected_size=self.files[rel][0],
                root_fd=self._dir_fd,
                trust=self.trust,
            )
        except CorruptStoreError as exc:
            if os.fstat(self._dir_fd).st_nlink == 0:  # our directory was removed
                raise CorruptStoreError(
                    f"{self.root} was replaced or deleted after this store was opened, and "
                    f"{rel} had not been read yet; open the store again",
                    str(path),
                ) from exc
            raise
        try:
            vrows = self._vrows
            if vrows is not None and offsets is None:
                try:
                    vrows.map_shard(k, fd, rows)
                except OSError:
                    self._vrows = None
                else:
                    self._vmapped[k] = True
                    start = k * self.rows_per_shard
                    view = vrows.rows[start : start + rows]
                    return MappedShard(buffer=None, rows=view, offsets=None, dtype=self.dtype,
                                       item_shape=self.item_shape)
            if offsets is not None:  # rows not in layout order: no contiguous view
                self._vrows = None
            return map_shard_fd(
                fd, rows=rows, offsets=offsets, item_shape=self.item_shape, dtype=self.dtype
            )
        finally:
            os.close(fd)

    # -- a budget of mapped shards ---------------------------------------------

    def _with_mapped(self, ks: Sequence[int], read: Callable[[], None]) -> None:
        """Run ``read`` under the lock while every shard of ``ks`` is mapped (budget mode).

        Downloads happen outside the lock; shards another thread unmapped
        meanwhile are asked for again. Afterwards the least recently used
        shards beyond the budget are unmapped and given back to the supply.
        """
        supply = self._supply
        assert supply is not None and self._budget is not None
        while True:
            missing = [k for k in ks if self._shards[k] is None]
            if missing:
                supply.ensure(missing)  # one hold each, kept while mapped
            with self._lock:
                for k in missing:
                    if self._shards[k] is None:
                        try:
                            self._shards[k] = self._map(k)
                        except BaseException:
                            supply.release(k)
                            raise
                    else:  # another thread mapped it meanwhile: our hold is one too many
                        supply.release(k)
                if any(self._shards[k] is None for k in ks):
                    continue  # unmapped by another thread before we locked: again
                for k in ks:
                    self._used[k] = None
                    self._used.move_to_end(k)
                read()
                self._trim(keep=ks)
                return

    def _trim(self, keep: Sequence[int]) -> None:
        """Unmap least recently used shards beyond the budget (under the lock)."""
        assert self._budget is not None and self._supply is not None
        if len(self._used) <= self._budget:
            return
        kept = set(keep)
        for k in list(self._used):
            if len(self._used) <= self._budget:
                return
            if k in kept:
                continue
            del self._used[k]
            vrows = self._vrows
            if vrows is not None and self._vmapped[k]:
                vrows.unmap_shard(k)
                self._vmapped[k] = False
            self._shards[k] = None
            self._supply.release(k)

    def _copy_row(self, row: int) -> npt.NDArray[np.generic]:
        k, i = divmod(row, self.rows_per_shard)
        with self._lock:  # the hot path: its shard is mapped
            shard = self._shards[k]
            if shard is not None:
                self._used.move_to_end(k)
                return (shard.rows[i] if shard.rows is not None else shard.row(i)).copy()
        out = np.empty(self.item_shape, dtype=self.dtype)

        def read() -> None:
            shard = self._shards[k]
            assert shard is not None
            out[...] = shard.rows[i] if shard.rows is not None else shard.row(i)

        self._with_mapped([k], read)
        return out

    def row(self, row: int) -> npt.NDArray[np.generic]:
        """Return a copy-on-write view of one row (a copy when shards are released, see budget)."""
        if self._budget is not None:
            return self._copy_row(row)
        every = self.all_rows
        if every is not None:
            view: npt.NDArray[np.generic] = every[row]
            return view
        vrows = self._vrows
        if vrows is not None and self._vmapped[row // self.rows_per_shard]:
            view = vrows.rows[row]
            return view
        k, i = divmod(row, self.rows_per_shard)
        rows = self.shard(k).rows
        if rows is not None:
            view = rows[i]
            return view
        return self.shard(k).row(i)

    def gather(self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.generic]) -> None:
        """Copy ``rows`` (valid local rows) into ``out`` in order."""
        if len(rows) == 0:
            return
        s = self.rows_per_shard
        shard_ids = rows // s
        if self._budget is not None:
            self._gather_budget(rows, shard_ids, out)
            return
        if not self._all_mapped:
            self._map_shards(np.unique(shard_ids).tolist())
        vrows = self._vrows  # None if mapping found rows out of layout order
        if vrows is not None:
            np.take(vrows.rows, rows, axis=0, out=out, mode="clip")  # bounds checked by the caller
            return
        # no contiguous view (rows out of layout order, or not Linux): shard by shard
        for k in np.unique(shard_ids).tolist():
            shard = self.shard(k)
            sel = np.flatnonzero(shard_ids == k)
            local = rows[sel] - k * s
            if shard.rows is not None:
                out[sel] = shard.rows[local]
            else:
                for j, i in zip(sel.tolist(), local.tolist(), strict=True):
                    out[j] = shard.row(i)

    def _gather_budget(
        self, rows: npt.NDArray[np.int64], shard_ids: npt.NDArray[np.int64],
        out: npt.NDArray[np.generic],
    ) -> None:
        """Gather under a budget of mapped shards: in groups, shards already mapped first."""
        assert self._budget is not None
        ks = np.unique(shard_ids).tolist()
        ks.sort(key=lambda k: self._shards[k] is None)  # stable: mapped ones first
        budget = self._budget
        whole = len(ks) <= budget
        for start in range(0, len(ks), budget):
            group = ks[start : start + budget]
            sel = None if whole else np.flatnonzero(np.isin(shard_ids, group))

            def read(group: list[int] = group, sel: Any = sel) -> None:
                vrows = self._vrows
                if vrows is not None and all(self._vmapped[k] for k in group):
                    if sel is None:
                        np.take(vrows.rows, rows, axis=0, out=out, mode="clip")
                    else:
                        out[sel] = np.take(vrows.rows, rows[sel], axis=0, mode="clip")
                    return
                for k in group:
                    shard = self._shards[k]
                    assert shard is not None
                    mine = np.flatnonzero(shard_ids == k)
                    local = rows[mine] - k * self.rows_per_shard
                    if shard.rows is not None:
                        out[mine] = shard.rows[local]
                    else:
                        for j, i in zip(mine.tolist(), local.tolist(), strict=True):
                            out[j] = shard.row(i)

            self._with_mapped(group, read)

    @property
    def budget(self) -> int | None:
        """Most shards mapped at once (None: no limit, rows are views)."""
        return self._budget

    @property
    def supply(self) -> ShardSupply | None:
        """Where this segment's shards come from when fetched on demand (None: all local)."""
        return self._supply

    def prefetch(
        self, rows: npt.NDArray[np.int64] | None, *, background: bool = False
    ) -> Future[int]:
        """Fetch the shards of ``rows`` (every shard if None) ahead of reads."""
        if self._supply is None:
            done: Future[int] = Future()
            done.set_result(0)
            return done
        if rows is None:
            ks = list(range(len(self._shards)))
        else:
            ks = np.unique(rows // self.rows_per_shard).tolist()
        return self._supply.prefetch(ks, background=background)

    def close(self) -> None:
        """Drop every mapping (views already handed out stay valid)."""
        self._close_dir()
        self._dir_fd = -1
        self._shards = [None] * len(self._shards)
        self._buffers = []
        self._vrows = None
        self.all_rows = None
        self._all_mapped = False
        self._used.clear()
        if self._supply is not None:
            self._supply.close()

