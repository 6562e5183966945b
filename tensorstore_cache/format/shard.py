"""Shard files: the zarr ``sharding_indexed`` layout, written and mapped.

A shard holding ``m`` of at most ``S`` rows is the rows' raw little-endian
C-order bytes, one inner chunk per row in row order, then the shard index:
``S`` pairs of little-endian ``uint64`` ``(offset, nbytes)`` (``2**64 - 1``
twice for a row past the end of the array), then the CRC32C of the index.
The reader checks the file size, the index checksum and that every row sits
where this layout puts it before handing out views; a shard whose rows lie
elsewhere (written by another zarr writer) is still read, row by row.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from ..fs import StoreWalk, Trust, open_sized, write_replace

__all__ = ["MappedShard", "map_shard_fd", "open_shard", "shard_file_size", "write_shard"]

_EMPTY = np.uint64(2**64 - 1)
#: CRC32C of any bytes followed by their own CRC32C (little-endian).
_CRC32C_RESIDUE = 0x48674BC7
#: Dense shard indexes of at most this many rows are kept once built, 8 at most (256 KiB
#: each, 2 MiB in all at most; a store's shards share a few).
_KEPT_INDEX_ROWS = 16384


def shard_file_size(rows: int, rows_per_shard: int, item_nbytes: int) -> int:
    """Return the size in bytes of a dense shard holding ``rows`` rows."""
    return rows * item_nbytes + 16 * rows_per_shard + 4


def _index_bytes(rows: int, rows_per_shard: int, item_nbytes: int) -> bytes:
    index = np.full((rows_per_shard, 2), _EMPTY, dtype="<u8")
    index[:rows, 0] = np.arange(rows, dtype="<u8") * np.uint64(item_nbytes)
    index[:rows, 1] = item_nbytes
    raw = index.tobytes()
    crc: int = google_crc32c.value(raw)
    return raw + crc.to_bytes(4, "little")


def write_shard(
    path: Path,
    block: npt.NDArray[np.generic],
    rows_per_shard: int,
    *,
    trust: Trust | None = None,
    sync: bool = True,
) -> tuple[int, str]:
    """Write the shard file ``path`` from ``block`` (rows x item), durably (``sync=False``:
    its writing-back started, :func:`~tensorstore_cache.fs.durable.fsync_tree` makes it
    durable) and atomically.

    Written with :func:`~tensorstore_cache.fs.durable.write_replace`: a reader
    or a retried task never finds a half-written file at ``path``, and
    writing the same shard twice (a retried task) is safe. The parent
    directory must exist (a late task of an abandoned build then fails
    instead of recreating the build directory).

    Parameters
    ----------
    path
        Target file; an existing file there is replaced.
    block
        The shard's rows, shape ``(m, *item_shape)`` with ``m <= rows_per_shard``.
    rows_per_shard
        The array's shard length ``S``.
    trust
        Whose cache it is: the file gets its mode (default ``0o644``
        through the umask).
    sync
        Fsync the file before it is renamed into place.

    Returns
    -------
    size : int
        Bytes written.
    checksum : str
        XXH3-128 of the file, hex.
    """
    data = np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<"))
    rows = data.shape[0]
    item_nbytes = data.nbytes // rows if rows else 0
    tail = _index_bytes(rows, rows_per_shard, item_nbytes)
    return write_replace(
        path, [data.reshape(-1).view(np.uint8).data, memoryview(tail)], trust=trust, sync=sync
    )


@dataclass(frozen=True, slots=True)
class MappedShard:
    """A shard mapped copy-on-write.

    Attributes
    ----------
    rows : numpy.ndarray or None
        ``(m, *item_shape)`` view of every row when the shard is dense.
    offsets : numpy.ndarray or None
        Byte offset of every row when it is not (rows are then read one by one).
    """

    buffer: mmap.mmap | None
    rows: npt.NDArray[np.generic] | None
    offsets: npt.NDArray[np.int64] | None
    dtype: np.dtype[np.generic]
    item_shape: tuple[int, ...]

    def row(self, i: int) -> npt.NDArray[np.generic]:
        """Return row ``i`` as a view."""
        if self.rows is not None:
            view: npt.NDArray[np.generic] = self.rows[i, ...]
            return view
        assert self.offsets is not None and self.buffer is not None
        count = math.prod(self.item_shape)
        flat = np.frombuffer(self.buffer, self.dtype, count, int(self.offsets[i]))
        return flat.reshape(self.item_shape)


def open_shard(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    rows: int,
    rows_per_shard: int,
    item_nbytes: int,
    expected_size: int,
    root_fd: int | StoreWalk | None = None,
    trust: Trust | None = None,
) -> tuple[int, npt.NDArray[np.int64] | None]:
    """Open a shard and check its size and index, reading only the index.

    ``trust`` is checked on every directory and the file opened (see
    :func:`~tensorstore_cache.fs.opens.open_regular`).

    Returns
    -------
    fd : int
        The open file (the caller closes it).
    offsets : numpy.ndarray or None
        ``None`` when the rows lie in layout order (the shard is dense), else
        the byte offset of every row.

    Raises
    ------
    CorruptStoreError
        If the file has the wrong size, its index checksum fails, a row is
        missing, or a row lies outside the data region.
    """
    fd = open_sized(path, root, expected_size, root_fd, trust=trust)
    size = expected_size
    try:
        index_len = 16 * rows_per_shard + 4
        if size < index_len:
            raise CorruptStoreError(f"{path} is too small to hold a shard index", str(path))
        start = size - index_len
        tail = os.pread(fd, index_len, start)
        # the CRC32C of the index followed by its checksum is a constant: no copy of the index
        if len(tail) != index_len or google_crc32c.value(tail) != _CRC32C_RESIDUE:
            raise CorruptStoreError(
                f"{path}: shard index checksum mismatch; the file is damaged", str(path)
            )
        if rows * item_nbytes <= start and tail[: 16 * rows] == _dense(rows, item_nbytes):
            return fd, None  # the rows lie in layout order, within the data: the usual case
        index = np.frombuffer(tail, dtype="<u8", count=2 * rows_per_shard).reshape(-1, 2)
        off, nbytes = index[:rows, 0], index[:rows, 1]
        _check_index(path, off, nbytes, rows, item_nbytes, start)
    except BaseException:
        os.close(fd)
        raise
    return fd, off.astype(np.int64)


def _dense(rows: int, item_nbytes: int) -> bytes:
    """The index entries of ``rows`` rows of ``item_nbytes`` lying in layout order from the
    shard's start: ``(offset, nbytes)`` pairs, little-endian uint64, compared as bytes (a
    shard's check costs no array work). Those of up to :data:`_KEPT_INDEX_ROWS` rows are
    kept (a store's shards share a few)."""
    if rows <= _KEPT_INDEX_ROWS:
        return _kept_dense(rows, item_nbytes)
    return _dense_bytes(rows, item_nbytes)


def _dense_bytes(rows: int, item_nbytes: int) -> bytes:
    """:func:`_dense`, built."""
    index = np.empty((rows, 2), dtype="<u8")
    index[:, 0] = np.arange(0, rows * item_nbytes, item_nbytes, dtype="<u8")[:rows]
    index[:, 1] = item_nbytes
    return index.tobytes()


_kept_dense = functools.lru_cache(maxsize=8)(_dense_bytes)


def _check_index(
    path: str | os.PathLike[str], off: npt.NDArray[np.uint64], nbytes: npt.NDArray[np.uint64],
    rows: int, item_nbytes: int, start: int,
) -> None:
    """Raise if a row of a shard index (not in layout order) is missing or lies outside the
    data (``start`` bytes)."""
    if np.any(off == _EMPTY):
        missing = int(np.flatnonzero(off == _EMPTY)[0])
        raise CorruptStoreError(
            f"{path}: row {missing} of this shard is missing (never written); the store "
            "is incomplete - rebuild it",
            str(path),
        )
    # off <= start - item_nbytes, written so that a hostile offset near 2**64 cannot wrap
    if rows and (
        start < item_nbytes
        or np.any(nbytes != item_nbytes)
        or np.any(off > start - item_nbytes)
    ):
        raise CorruptStoreError(f"{path}: shard index points outside the data", str(path))


def map_shard_fd(
    fd: int,
    *,
    rows: int,
    offsets: npt.NDArray[np.int64] | None,
    item_shape: tuple[int, ...],
    dtype: np.dtype[np.generic],
) -> MappedShard:
    """Map a shard checked by :func:`open_shard` copy-on-write."""
    buf = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    if offsets is not None:
        return MappedShard(buffer=buf, rows=None, offsets=offsets, dtype=dtype,
                           item_shape=item_shape)
    count = rows * math.prod(item_shape)
    view = np.frombuffer(buf, dtype, count).reshape((rows, *item_shape))
    return MappedShard(buffer=buf, rows=view, offsets=None, dtype=dtype, item_shape=item_shape)
