"""One published store directory, mapped: its index and its shards.

Opening maps the six small index arrays (``O(1)`` system calls, no
per-entry Python objects); shard files are mapped lazily, the first time one
of their rows is read.
"""

from __future__ import annotations

import bisect
import mmap
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ._errors import CorruptStoreError
from ._format import INDEX_ARRAYS, index_array_length, parse_group, shard_count, shard_key
from ._shard import MappedShard, map_file, map_shard

__all__ = ["Segment"]


class Segment:
    """A mapped store directory.

    Parameters
    ----------
    root
        The store directory (a zarr v3 group written by this library).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec, self.files, key_bytes_len = parse_group(root)
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
            buf = map_file(root / rel, root, self.files[rel][0], copy_on_write=False)
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
        # memoryviews give C-speed bisect with plain Python ints for single lookups
        self._hash_mv: Sequence[int] = (
            self.key_hash.view(np.uint8).data.cast("Q") if self.n else []
        )
        self._shards: list[MappedShard | None] = [None] * shard_count(self.spec)
        self._lock = threading.Lock()

    # -- keys ---------------------------------------------------------------

    def key_at(self, row: int) -> bytes:
        """Return the stored key bytes of ``row``."""
        start, stop = int(self.key_offsets[row]), int(self.key_offsets[row + 1])
        return self.key_bytes[start:stop].tobytes()

    def find(self, encoded: bytes, h: int) -> int:
        """Return the row of one key, or -1."""
        mv = self._hash_mv
        pos = bisect.bisect_left(mv, h)
        n = self.n
        while pos < n and mv[pos] == h:
            row = int(self.key_row[pos])
            if self.key_at(row) == encoded:
                return row
            pos += 1
        return -1

    def find_many(self, encoded: Sequence[bytes], hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Return the row of every key, -1 where absent (vectorised search)."""
        out = np.full(len(encoded), -1, dtype=np.int64)
        if self.n == 0 or len(encoded) == 0:
            return out
        pos = np.searchsorted(self.key_hash, hashes, side="left")
        pos_c = np.minimum(pos, self.n - 1)
        hit = self.key_hash[pos_c] == hashes
        cand = np.where(hit, self.key_row[pos_c], -1)
        offs, kb = self.key_offsets, self.key_bytes
        for i in np.flatnonzero(hit).tolist():
            row = int(cand[i])
            enc = encoded[i]
            if kb[int(offs[row]) : int(offs[row + 1])].tobytes() == enc:
                out[i] = row
            else:  # hash collision: scan the run of equal hashes
                out[i] = self.find(enc, int(hashes[i]))
        return out

    def key_list(self) -> list[str]:
        """Return every key in row order (decodes all of them)."""
        raw = self.key_bytes.tobytes()
        offs = self.key_offsets.tolist()
        return [
            raw[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(self.n)
        ]

    # -- vectors --------------------------------------------------------------

    def shard(self, k: int) -> MappedShard:
        """Return shard ``k``, mapping it on first use."""
        shard = self._shards[k]
        if shard is None:
            with self._lock:
                shard = self._shards[k]
                if shard is None:
                    rel = shard_key(self.spec, k)
                    rows = min(self.rows_per_shard, self.n - k * self.rows_per_shard)
                    shard = map_shard(
                        self.root / rel,
                        self.root,
                        rows=rows,
                        rows_per_shard=self.rows_per_shard,
                        item_shape=self.item_shape,
                        dtype=self.dtype,
                        expected_size=self.files[rel][0],
                    )
                    self._shards[k] = shard
        return shard

    def row(self, row: int) -> npt.NDArray[np.generic]:
        """Return a copy-on-write view of one row."""
        k, i = divmod(row, self.rows_per_shard)
        return self.shard(k).row(i)

    def gather(self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.generic]) -> None:
        """Copy ``rows`` (valid local rows) into ``out`` in order."""
        if len(rows) == 0:
            return
        s = self.rows_per_shard
        shard_ids = rows // s
        first = int(shard_ids[0])
        if len(rows) == 1 or not np.any(shard_ids != first):
            shard = self.shard(first)
            if shard.rows is not None:
                np.take(shard.rows, rows - first * s, axis=0, out=out)
                return
        local = rows - shard_ids * s
        for j, (k, i) in enumerate(zip(shard_ids.tolist(), local.tolist(), strict=True)):
            out[j] = self.shard(k).row(i)

    def close(self) -> None:
        """Drop every mapping (views already handed out stay valid)."""
        self._shards = [None] * len(self._shards)
        self._buffers = []

