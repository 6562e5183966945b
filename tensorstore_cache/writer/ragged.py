"""Writing a ragged (or text) field: values in page-aligned chunks, offsets, shapes.

A ragged field's values are written in row order, as they come (from the
runs the shard tasks of a build left, or from the rows of parts a merge
copies), into chunk files of ``chunk`` rows of ``values`` each, every one
full size (the last padded with zeros), as zarr's regular chunk grid wants;
``chunk`` makes every file a whole number of pages, so that the reader lays
the chunks side by side in memory. The offsets (``uint64``, ``n + 1``) and,
for a field that varies in more than its first dimension, every row's
varying sizes (``int32``, ``(n, k)``) follow. Every file is written with
:func:`~tensorstore_cache.fs.write_replace` (renamed into place, its writing-back started;
the store is made durable as a whole before it is published).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import Field, FieldLayout, Ragged, chunk_rows
from ..fs import EXPLICIT, Trust, make_dir, write_replace

__all__ = ["RAGGED_CHUNK_BYTES", "RaggedWriter", "ragged_values"]

#: Target size of one chunk file of a ragged field's values.
RAGGED_CHUNK_BYTES = 8 << 20


class RaggedWriter:
    """Writes one ragged or text field of a store being assembled in ``root``.

    Parameters
    ----------
    root
        The unpublished store directory.
    name, field
        The field.
    n, total
        Rows of the store, and rows of ``values`` they hold in all.
    trust
        The modes of what is created.
    target_bytes
        Target size of a chunk file, at most :data:`RAGGED_CHUNK_BYTES` (the default).
    """

    def __init__(
        self,
        root: Path,
        name: str,
        field: Field,
        *,
        n: int,
        total: int,
        trust: Trust = EXPLICIT,
        target_bytes: int | None = None,
    ) -> None:
        self.root = root
        self.trust = trust
        probe = FieldLayout(name, field, n, total=total, path=f"fields/{name}")
        target = RAGGED_CHUNK_BYTES if target_bytes is None else min(
            target_bytes, RAGGED_CHUNK_BYTES)
        chunk = chunk_rows(total, probe.row_nbytes, target)
        self.layout = FieldLayout(name, field, n, chunk=chunk, total=total, path=probe.path)
        self.row_nbytes = probe.row_nbytes
        self.flat = isinstance(field, Ragged) and field.flat
        k = len(field.varying) if isinstance(field, Ragged) else 1
        self.offsets = np.zeros(n + 1, np.uint64)
        self.shapes = np.zeros((n, k), np.int32) if self.flat else None
        self.rows = 0  # store rows written so far
        self.written = 0  # rows of values written so far
        self.files: dict[str, tuple[int, str]] = {}
        self._buffer = bytearray()
        self._next_chunk = 0
        base = root / self.layout.path
        for d in (base, base / "values", base / "values" / "c", base / "offsets",
                  *([base / "shapes"] if self.flat else [])):
            if not d.is_dir():
                make_dir(d, trust)

    def append(
        self,
        values: npt.NDArray[Any],
        lengths: npt.NDArray[np.int64],
        shapes: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Add rows: their values (concatenated, rows of ``values``), each row's length in
        them and, for a field flat on disk, each row's varying sizes."""
        m = len(lengths)
        if self.rows + m > len(self.offsets) - 1:
            raise ValueError(f"more rows than the {len(self.offsets) - 1} of the store")
        lengths = np.asarray(lengths, np.int64)
        if int(lengths.sum()) * self.row_nbytes != values.nbytes:
            raise ValueError("the rows' lengths do not add up to their values")
        ends = self.written + np.cumsum(lengths, dtype=np.int64)
        self.offsets[self.rows + 1 : self.rows + m + 1] = ends
        if self.shapes is not None:
            assert shapes is not None
            if np.any(shapes > np.iinfo(np.int32).max):
                raise ValueError("a row is larger than 2**31 - 1 along a dimension")
            self.shapes[self.rows : self.rows + m] = shapes
        self.rows += m
        self.written += int(lengths.sum())
        data = np.ascontiguousarray(values, dtype=np.dtype(self.layout.dtype).newbyteorder("<"))
        self._buffer += data.reshape(-1).view(np.uint8).tobytes()
        chunk_bytes = self.layout.chunk * self.row_nbytes
        while len(self._buffer) >= chunk_bytes and chunk_bytes:
            self._write_chunk(bytes(self._buffer[:chunk_bytes]))
            del self._buffer[:chunk_bytes]

    def _write_chunk(self, data: bytes) -> None:
        chunk_bytes = self.layout.chunk * self.row_nbytes
        rel = self.layout.chunk_key(self._next_chunk)
        path = self.root / rel
        for d in reversed(path.parents):
            if d.is_relative_to(self.root / self.layout.path / "values" / "c") and not d.is_dir():
                make_dir(d, self.trust)
        pad = memoryview(bytes(chunk_bytes - len(data)))
        self.files[rel] = write_replace(path, [memoryview(data), pad], trust=self.trust,
                                        sync=False)
        self._next_chunk += 1

    def finish(self) -> tuple[FieldLayout, dict[str, tuple[int, str]]]:
        """Write the last chunk, the offsets and the shapes; return the field and its files."""
        layout = self.layout
        if self.rows != layout.n or self.written != layout.total:
            raise ValueError(
                f"field {layout.name!r}: {self.rows} of {layout.n} rows and {self.written} of "
                f"{layout.total} values written"
            )
        if self._buffer:
            self._write_chunk(bytes(self._buffer))
            self._buffer.clear()
        assert self._next_chunk == layout.shard_count()
        base = self.root / layout.path
        self.files.update(self._array(base / "offsets", self.offsets, ("0",)))
        if self.shapes is not None and layout.n:
            self.files.update(self._array(base / "shapes", self.shapes, ("0", "0")))
        return layout, self.files

    def _array(
        self, directory: Path, data: npt.NDArray[Any], key: tuple[str, ...]
    ) -> dict[str, tuple[int, str]]:
        d = directory / "c"
        for part in key[:-1]:
            if not d.is_dir():
                make_dir(d, self.trust)
            d = d / part
        if not d.is_dir():
            make_dir(d, self.trust)
        path = d / key[-1]
        raw = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
        entry = write_replace(path, [raw.reshape(-1).view(np.uint8).data], trust=self.trust,
                              sync=False)
        rel = path.relative_to(self.root).as_posix()
        return {rel: entry}


def ragged_values(
    field: Field, rows: list[npt.NDArray[Any]]
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """The rows of one shard of a ragged or text field as ``(values, lengths, shapes)``."""
    inner = field.inner
    flat = isinstance(field, Ragged) and field.flat
    lengths = np.fromiter((r.size if flat else r.shape[0] for r in rows), np.int64, len(rows))
    shapes = None
    if flat and isinstance(field, Ragged):
        varying = field.varying
        shapes = np.array([[r.shape[d] for d in varying] for r in rows], np.int64).reshape(
            len(rows), len(varying))
    if rows:
        values = np.concatenate([r.reshape(-1) if flat else r.reshape(-1, *inner) for r in rows])
    else:
        values = np.empty((0, *inner), np.dtype(field.dtype))
    return values, lengths, shapes

