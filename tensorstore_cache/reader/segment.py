"""One published store directory, mapped: its index and the arrays of its fields.

Opening reads the metadata once and maps the six small index arrays
(``O(1)`` system calls, no per-entry Python objects; the key arrays form its
:class:`~tensorstore_cache.reader.keyindex.KeyIndex`). The values are one
array per field: the ``vectors`` of a store of one tensor per key, or each
field of a store of records (:class:`~tensorstore_cache.reader.fixed.FixedArray`
for a fixed field, :class:`~tensorstore_cache.reader.ragged.RaggedArray` for a
ragged or text one), their files mapped when first read. A store whose data
files are fetched on demand gives a
:class:`~tensorstore_cache.reader.supply.ShardSupply` made from that metadata:
one supply for every array of the segment, which names the files by their ids
(:func:`~tensorstore_cache.format.metadata.fetched_files`) and share its budget.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError, StoreNotFoundError
from ..format import (
    INDEX_ARRAYS,
    Fixed,
    GroupMetadata,
    MappedShard,
    first_file_ids,
    index_array_length,
)
from ..fs import StoreWalk, Trust, map_file, open_dir, open_root
from .fixed import FixedArray
from .keyindex import KeyIndex
from .mapped import SegmentFiles, prefetched
from .ragged import RaggedArray
from .record import Record
from .supply import ShardSupply

__all__ = ["Segment"]

#: The index arrays of the key index.
_KEY_ARRAYS = ("key_hash", "key_row", "key_offsets", "key_bytes")
#: Each index array's dtype, little-endian as the files are.
_LITTLE = {name: np.dtype(dtype).newbyteorder("<") for name, dtype in INDEX_ARRAYS.items()}


class Segment:
    """A mapped store directory.

    Parameters
    ----------
    root
        The store directory (a zarr v3 group written by this library).
    trust
        Whose directories and files may be read: checked on the store
        directory and every directory and file opened in it, now and when a
        shard is mapped later (see :mod:`tensorstore_cache.fs.trust`).
        Default: a store the user named (warned about if others can write it).
    parent_fd
        A checked descriptor of the directory holding the store: ``root`` is
        then opened in it by name, never through a symlink (a cache's part).
        None: ``root`` is opened by its path (it may be a symlink).
    supply
        Makes, from the metadata this segment reads, the supply asked for the
        files (shards of fixed fields, chunks of ragged values) about to be
        mapped for the first time (all the files of one batch of a field at
        once); they are then checked like any other (size, index checksum).
        None: every file is already there. Under the supply's ``budget``
        (most files mapped at once; None: no limit, rows are views), shared
        evenly by the segment's arrays, least recently used files are
        unmapped and given back to the supply, so rows are returned as
        copies, never views that could point into a released file, and a
        batch spanning more files is gathered in groups of the array's share.
    hashes
        Reads the recorded content hashes of the segment's sources, given its
        number of rows (None: none are kept); called once, at open.
    """

    def __init__(
        self,
        root: Path,
        *,
        trust: Trust | None = None,
        parent_fd: int | None = None,
        supply: Callable[[GroupMetadata], ShardSupply] | None = None,
        hashes: Callable[[int], npt.NDArray[np.uint64] | None] | None = None,
    ) -> None:
        self.root = root
        self._supply: ShardSupply | None = None
        self._supply_closed = False
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
        try:  # every directory opened once on the way (see StoreWalk)
            with StoreWalk(root, self._dir_fd, self.trust) as walk:
                meta = GroupMetadata.read(root, walk, trust=self.trust)
                self._open(root, meta, walk)
                self._content_hashes = hashes(self.n) if hashes is not None else None
                if supply is not None:
                    self._supply = supply(meta)
                self.arrays: dict[str, FixedArray | RaggedArray] = {}
                """The array of every field (``"vectors"`` for one tensor per key)."""
                layouts = self.spec.layouts()
                firsts = first_file_ids(self.spec)
                source = SegmentFiles(root, lambda: self.dir_fd, self.files, self.trust,
                                      self._supply, share=len(layouts))
                for layout in layouts:
                    if isinstance(layout.field, Fixed):
                        self.arrays[layout.name] = FixedArray(layout, source, firsts[layout.name])
                    else:
                        self.arrays[layout.name] = RaggedArray(
                            layout, source, firsts[layout.name], walk)
                #: ``(name, its array's row method)`` of every field, bound once (record())
                self._rows = tuple((name, array.row) for name, array in self.arrays.items())
        except BaseException:
            self._close_dir()
            if self._supply is not None:
                self._supply.close()
            raise

    @property
    def dir_fd(self) -> int:
        """Descriptor of the store directory this segment opened (-1 once closed)."""
        if self._dir_fd < 0:
            raise ValueError(f"store {str(self.root)!r} is closed")
        return self._dir_fd

    def _open(self, root: Path, meta: GroupMetadata, walk: StoreWalk) -> None:
        self.spec, self.files, self._key_bytes_len = meta.spec, meta.files, meta.key_bytes_len
        self.n = self.spec.n
        self._buffers: list[mmap.mmap] = []
        self.keys = KeyIndex(root, self.n, *(self._index(name, walk) for name in _KEY_ARRAYS))
        """Which row holds a key."""
        # mapped at open too, though only staleness checks read them: every index file is
        # checked (and refused, named) when the store is opened
        self.source_size = self._index("source_size", walk)
        """Each source's size when it was read (``-1``: unknown)."""
        self.source_mtime_ns = self._index("source_mtime_ns", walk)
        """Each source's modification time (ns) when it was read, or its version token."""

    def _index(self, name: str, walk: StoreWalk) -> npt.NDArray[np.generic]:
        """Index array ``name``, mapped (its size checked first)."""
        dtype = INDEX_ARRAYS[name]
        length = index_array_length(name, self.spec, self._key_bytes_len)
        if length == 0:
            return np.empty(0, dtype=np.dtype(dtype))
        rel = f"{name}/c/0"
        path = f"{self.root}/{rel}"
        buf = map_file(path, self.root, self.files[rel][0],
                       root_fd=walk, trust=self.trust)
        if buf is None or len(buf) != length * _LITTLE[name].itemsize:
            raise CorruptStoreError(f"{path} has the wrong size", path)
        self._buffers.append(buf)
        return np.frombuffer(buf, _LITTLE[name], length)

    # -- source identity ------------------------------------------------------

    def content_hashes(self) -> npt.NDArray[np.uint64] | None:
        """Return the recorded content hash of every row (0: unknown), or None if none was
        recorded (see :mod:`tensorstore_cache.reader.sources`)."""
        return self._content_hashes

    # -- values -----------------------------------------------------------------

    def fixed(self, name: str) -> FixedArray:
        """The array of fixed field ``name`` (``"vectors"``: the tensors of format 1)."""
        array = self.arrays[name]
        assert isinstance(array, FixedArray)
        return array

    def ragged(self, name: str) -> RaggedArray:
        """The arrays of ragged or text field ``name``."""
        array = self.arrays[name]
        assert isinstance(array, RaggedArray)
        return array

    def record(self, row: int) -> Record:
        """The record of ``row`` (a store of records): every field's value, in schema order."""
        return Record({name: value(row) for name, value in self._rows})

    @property
    def vectors(self) -> FixedArray:
        """The one array of a store of one tensor per key."""
        return self.fixed("vectors")

    def map_all(self) -> None:
        """Map every file of every field now: the segment then needs none of them again."""
        for array in self.arrays.values():
            array.map_all()

    def shard(self, k: int) -> MappedShard:
        """Shard ``k`` of the vectors (format 1), mapping (and checking) it on first use."""
        return self.vectors.shard(k)

    def row(self, row: int) -> npt.NDArray[np.generic]:
        """Vector ``row`` (format 1): a copy-on-write view (a copy under a budget)."""
        return self.vectors.row(row)

    def gather(self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.generic]) -> None:
        """Copy vectors ``rows`` (valid local rows; format 1) into ``out`` in order."""
        self.vectors.gather(rows, out)

    @property
    def supply(self) -> ShardSupply | None:
        """Where this segment's files come from when fetched on demand (None: all local)."""
        return self._supply

    def prefetch(
        self, rows: npt.NDArray[np.int64] | None, *, background: bool = False
    ) -> Future[int]:
        """Fetch the files of every field holding ``rows`` (every file if None) ahead of
        reads."""
        return prefetched(
            self._supply, lambda: [i for a in self.arrays.values() for i in a.file_ids(rows)],
            background)

    def close(self) -> None:
        """Drop every mapping (views already handed out stay valid) and close the supply."""
        self._close_dir()
        self._dir_fd = -1
        self._buffers = []
        for array in getattr(self, "arrays", {}).values():
            array.close()
        if self._supply is not None and not self._supply_closed:
            self._supply_closed = True
            self._supply.close()
