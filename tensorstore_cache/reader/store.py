"""The handle: :class:`CacheStore`, over one store directory or several segments."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ..config import Check, Missing, check_mode
from ..errors import CorruptStoreError, KeyNotInStoreError
from ..format import (
    Fixed,
    Problem,
    Ragged,
    StoreSpec,
    Text,
    VerifyReport,
    encode_as_given,
    encode_keys_laid_out,
    hash_key,
    normalize_key,
    normalize_keys,
    path_sequence,
    verify_segments,
)
from .overlay import Overlay
from .ragged import RaggedArray
from .record import Record
from .segment import Segment
from .sets import distinct
from .sources import Identity, SourceIdentity, resolve_identity, stale_mask, token_map
from .supply import FetchStats

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CacheStore", "Location", "open_field", "open_location"]

_T = TypeVar("_T")
#: Keys looked up per vectorised step of :meth:`CacheStore.rows` (their temporaries stay
#: small: a process keeps the heap that large temporaries grew).
_ROWS_CHUNK = 1024
#: Most bytes of paths per step of :meth:`CacheStore.rows`: a step's temporaries (about one
#: byte each per byte of its paths) stay under glibc's initial mmap threshold (128 KiB), so
#: they are reused from the heap instead of growing it for good.
_ROWS_BYTES = 96 << 10
#: :meth:`CacheStore.rows` of more than :data:`_ROWS_CHUNK` paths looks each distinct path
#: up once when at most this share of them are distinct (a ratings table's paths).
_REPEATS = 0.8


class Location(Protocol):
    """Where a store lives, resolved once: a frozen, picklable value that opens the store.

    Each layer that knows a kind of location defines one (a store directory,
    a cache namespace's parts, a remote store's copy in the node cache); a
    store pickles as its location.
    """

    @property
    def shown(self) -> str:
        """The location as :attr:`CacheStore.location` shows it (a directory)."""

    def open(self) -> CacheStore:
        """Open the store it names (in any process)."""


def open_location(where: Location) -> CacheStore:
    """Open the store at ``where`` (how a pickled store is opened again)."""
    return where.open()


class CacheStore:
    """A read-only, memory-mapped store of vectors (or records) keyed by path.

    Obtain one with :func:`open_store`, :func:`build_store` or
    :func:`cached`. It behaves like a read-only mapping from path to vector:
    ``store[path]`` raises :class:`KeyNotInStoreError` on a miss, ``.get``
    does not, ``path in store`` and ``len(store)`` work, and it is a context
    manager. Vectors are views of the mapped files (copy-on-write: writing to
    one changes only this process's copy, never the file).

    A store of records (named fields per key) returns a
    :class:`~tensorstore_cache.reader.record.Record` for ``store[path]`` and a
    dict of its fields' batches for :meth:`take`; :meth:`field` gives one
    field as a store of its own, with this whole API.

    A store is made of one or more segments (store directories; a cache
    namespace has one per part), later segments overriding earlier ones.
    :attr:`segments`, :meth:`locate`, :meth:`vector` and
    :meth:`source_identity` are the interface the library's own layers use.

    Examples
    --------
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> with tsc.open_store("covers.tsc") as store:
    ...     v = store[paths[0]]                    # (3, 32, 32) float32 view
    ...     batch = store.take(store.rows(paths))  # (B, 3, 32, 32) array
    ...     print(v.shape, batch.shape, paths[0] in store, store.get("no/such.jpg"))
    (3, 32, 32) (8, 3, 32, 32) True None
    """

    def __init__(
        self,
        segments: Sequence[Segment],
        where: Location,
        *,
        spec: StoreSpec | None,
        resources: Sequence[Any] = (),
    ) -> None:
        # built by the reader alone (tensorstore_cache.reader.assembly)
        self._overlay = Overlay(segments)
        self._spec = spec  # None: combined from the segments when first asked for
        self._where = where
        self._location = where.shown
        self._closed = False
        self._paths: list[str] | None = None
        self._resources = list(resources)  # closed with the store (e.g. readers' locks)
        self._parent: CacheStore | None = None
        first = spec if spec is not None else segments[0].spec
        self._records = first.records
        self._layouts = {f.name: f for f in first.layouts()}
        self._set_field(None if self._records else "vectors")

    def _set_field(self, field: str | None) -> None:
        """Read ``field`` (None: whole records) of every segment."""
        self._field = field
        layout = None if field is None else self._layouts[field]
        self._kind = "record" if layout is None else layout.kind
        shape = None if layout is None else layout.field.shape
        self._item_shape: tuple[int, ...] | None = (
            tuple(shape) if layout is not None and layout.kind == "fixed" else None  # type: ignore[arg-type]
        )
        self._dtype: np.dtype[Any] | None = None if layout is None else np.dtype(layout.dtype)
        # the one fast path: store[path] of a fixed field on a store of one segment
        segments = self._overlay.segments
        single = segments[0] if len(segments) == 1 and self._kind == "fixed" else None
        self._single = None if single is None or field is None else single.fixed(field)
        self._single_find = single.keys.find if single is not None else None

    def field(self, name: str) -> CacheStore:
        """Field ``name`` of a store of records, as a store of its own.

        A fixed field has the whole API of a store of one tensor per key
        (``store[p]``, ``rows``, ``take``, ``stack``, ``series``...); a ragged
        field's ``store[p]`` is a view of its row and ``take`` a
        :class:`~tensorstore_cache.format.fields.Ragged` batch; a text field's
        values are ``str``. It shares this store's mappings: it stays usable
        while this store is open.

        Examples
        --------
        >>> loader = lambda p: {"image": tsc.ImageLoader(dtype="uint8")(p), "name": p}
        >>> store = tsc.build_store(paths, "records.tsc", loader=loader,
        ...                         loader_id="demo.named/1", progress=False)
        >>> images = store.field("image")
        >>> images.take(images.rows(paths)).shape
        (8, 3, 32, 32)
        """
        self._check_open()
        if name not in self._layouts or not self._records:
            known = list(self._layouts) if self._records else []
            raise KeyError(
                f"{self._location!r} has no field {name!r}"
                + (f"; its fields are {known}" if known else " (it holds one tensor per key)")
            )
        view = object.__new__(CacheStore)
        view.__dict__.update(self.__dict__)
        view._resources = []
        view._parent = self
        view._set_field(name)
        return view

    # -- description ----------------------------------------------------------

    @property
    def records(self) -> bool:
        """Whether ``store[p]`` is a record (a store of records; not one of its fields)."""
        return self._kind == "record"

    @property
    def fixed(self) -> bool:
        """Whether every value has one shape and dtype (a store of one tensor per key, or a
        fixed field of records): the API of arrays (``take(out=)``, ``shape``...) applies."""
        return self._kind == "fixed"

    @property
    def spec(self) -> StoreSpec:
        """The store's :class:`StoreSpec` (``n`` counts distinct keys).

        A field of a store of records (:meth:`field`) has the store's spec with
        the field's ``item_shape`` (fixed fields) and ``dtype``.
        """
        if self._spec is None:
            self._spec = _combined_spec(self._overlay)
        if self._records and self._field is not None:
            return dataclasses.replace(self._spec, item_shape=self._item_shape,
                                       dtype=None if self._dtype is None else self._dtype.name)
        return self._spec

    @property
    def location(self) -> str:
        """Where the store lives (a directory)."""
        return self._location

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len(store), *item_shape)`` (of a fixed field; a store of records: ``(len,)``)."""
        return (len(self), *(self._item_shape or ()))

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the vectors (of the field, for a field of records)."""
        if self._dtype is None:
            raise TypeError(
                f"{self._location!r} holds records, whose fields have their own dtypes "
                "(spec.fields); use store.field(name).dtype"
            )
        return self._dtype

    @property
    def paths(self) -> list[str]:
        """Every key, in row order (``store.paths[i]`` is the key of row ``i``)."""
        self._check_open()
        if self._paths is None:
            self._paths = self._overlay.paths()
        return self._paths

    def __len__(self) -> int:
        return self._overlay.n

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        elif self._kind == "record":
            state = f"{len(self)} records of {', '.join(self._layouts)}"
        else:
            shape = self._item_shape if self._kind == "fixed" else self._kind
            state = f"{len(self)} x {shape} {self.dtype.name}"
            state = state if self._field == "vectors" else f"field {self._field!r}: {state}"
        return f"<CacheStore {self._location!r}: {state}>"

    # -- the interface of the library's own layers --------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The mapped store directories, oldest first (later ones override earlier ones)."""
        return self._overlay.segments

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """Map valid rows to ``(segment index, local row in that segment)`` arrays."""
        return self._overlay.locate(rows)

    def vector(self, row: int) -> Any:
        """Return the value of ``row`` (a copy-on-write view of the mapped file, or a Record)."""
        if self._closed:
            self._check_open()
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is out of range for a store of {len(self)} rows")
        return self._value(*self._overlay.locate_one(row))

    def _value(self, k: int, local: int) -> Any:
        """The value of local row ``local`` of segment ``k``."""
        arrays = self._overlay.segments[k].arrays
        if self._field is None:
            return Record({name: arrays[name].row(local) for name in self._layouts})
        return arrays[self._field].row(local)

    def source_identity(
        self, rows: npt.NDArray[np.int64], *, content_hash: bool = False
    ) -> SourceIdentity:
        """Return what was recorded about the sources of valid ``rows`` at build time.

        Parameters
        ----------
        rows
            Store rows.
        content_hash
            Also return the recorded content hashes (0 where none was recorded).
        """
        self._check_open()
        seg_of, local = self.locate(rows)
        size = np.empty(len(rows), np.int64)
        mtime = np.empty(len(rows), np.int64)
        hashes = np.zeros(len(rows), np.uint64) if content_hash else None
        kinds = np.full(len(rows), "stat", dtype="<U5")
        for k in distinct(seg_of):
            sel = np.flatnonzero(seg_of == k)
            seg = self.segments[k]
            size[sel] = seg.source_size[local[sel]]
            mtime[sel] = seg.source_mtime_ns[local[sel]]
            kinds[sel] = seg.spec.identity
            recorded = seg.content_hashes() if hashes is not None else None
            if hashes is not None and recorded is not None:
                hashes[sel] = recorded[local[sel]]
        return SourceIdentity(size=size, mtime_ns=mtime, content_hash=hashes, recorded=kinds)

    # -- lookups --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self._location!r} is closed")

    def __getitem__(self, path: str | os.PathLike[str]) -> Any:
        """Return the vector of ``path`` as a copy-on-write view (a Record for records).

        A store opened from a URL with a cap of its node cache (``max_bytes``,
        ``$TSC_CACHE_MAX_BYTES`` or a cap recorded in the cache) returns a copy
        instead: it unmaps shards it no longer uses, and a view could point into
        one of them.
        """
        if self._closed:
            self._check_open()
        find = self._single_find
        if find is not None and type(path) is str:  # the one fast path, measured
            # Stored keys are normalised and normalising is idempotent, so a path found as
            # it is needs no normalising; any other path is looked up normalised below.
            encoded = path.encode("utf-8", "surrogateescape")  # encode_key, inlined
            row = find(encoded, hash_key(encoded))
            if row >= 0:
                single = self._single
                assert single is not None
                every = single.all_rows  # FixedArray.row, inlined for the common case
                return every[row, ...] if every is not None else single.row(row)
        key = normalize_key(path)
        k, local = self._overlay.find(key)
        if k < 0:
            raise KeyNotInStoreError([key])
        return self._value(k, local)

    @overload
    def get(self, path: str | os.PathLike[str]) -> Any | None: ...
    @overload
    def get(self, path: str | os.PathLike[str], default: _T) -> Any | _T: ...
    def get(self, path: str | os.PathLike[str], default: Any = None) -> Any:
        """Return the vector (or record) of ``path``, or ``default`` when it is not stored."""
        self._check_open()
        k, local = self._overlay.find(normalize_key(path))
        return default if k < 0 else self._value(k, local)

    def __contains__(self, path: object) -> bool:
        self._check_open()
        try:
            key = normalize_key(path)
        except (TypeError, ValueError):
            return False
        return self._overlay.find(key)[0] >= 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def rows(
        self, paths: Iterable[str | os.PathLike[str]], *, missing: Missing = "raise"
    ) -> npt.NDArray[np.int64]:
        """Return the row of every path, vectorised.

        Parameters
        ----------
        paths
            Any iterable of paths (a list, a pandas Series, ...), duplicates allowed.
        missing
            ``"raise"`` (default) raises :class:`KeyNotInStoreError` naming every
            absent path; ``"ignore"`` returns -1 for them.

        Returns
        -------
        numpy.ndarray
            ``int64`` rows, in the order of ``paths``.
        """
        self._check_open()
        check_mode("missing", missing, Missing)
        values = path_sequence(paths)
        if len(values) > _ROWS_CHUNK and _repeats(values):  # look each distinct path up once
            first: dict[Any, int] = {}  # path -> where it first occurs
            try:  # one dict operation per path: where each path first occurs
                at = np.fromiter(map(first.setdefault, values, range(len(values))), np.int64,
                                 len(values))
            except TypeError:  # an unhashable item: looked up (and refused) as it is
                return self._rows(values, missing)
            if len(first) <= _REPEATS * len(values):
                found = np.empty(len(values), dtype=np.int64)  # filled where paths first occur
                found[np.fromiter(first.values(), np.int64, len(first))] = self._rows(
                    list(first), missing
                )
                return found[at]
        return self._rows(values, missing)

    def _rows(self, values: Sequence[Any], missing: Missing) -> npt.NDArray[np.int64]:
        """:meth:`rows` of a sequence of paths, in steps of at most :data:`_ROWS_CHUNK`."""
        out = np.empty(len(values), dtype=np.int64)
        missing_keys: list[str] = []
        # In chunks: the temporaries of a lookup grow with the keys' bytes, and a
        # process keeps freed heap, so one huge call would cost memory for good.
        step = _step(values)
        for start in range(0, len(values), step):
            part = values[start : start + step]
            found, absent = self._find_chunk(part, named=missing == "raise")
            out[start : start + len(part)] = found
            missing_keys.extend(absent)
        if missing_keys:
            raise KeyNotInStoreError(missing_keys)
        return out

    def _find_chunk(
        self, part: Sequence[Any], named: bool
    ) -> tuple[npt.NDArray[np.int64], list[str]]:
        """The rows of a chunk of paths (-1 where absent) and, if ``named``, the keys of the
        absent ones.

        The paths are first looked up as they are (a path equal to a stored key
        is that key: :func:`~tensorstore_cache.format.encode_as_given`); only
        those not found are normalised (raising for a bad path) and, where that
        changes them, looked up again.
        """
        given = encode_as_given(part)
        if given is None:  # not all str, or a NUL: normalised (or refused) first
            keys, encoded, layout = encode_keys_laid_out(part)
            found = self._overlay.find_many(encoded, layout)
            return found, _absent(keys, found, named)
        found = self._overlay.find_many(*given)
        if bool(found.min() >= 0):
            return found, []
        miss = np.flatnonzero(found < 0)
        unfound = [part[i] for i in miss.tolist()]
        keys, encoded, layout = encode_keys_laid_out(unfound)
        if keys is not unfound:  # some are not their own key: look the keys up
            found[miss] = again = self._overlay.find_many(encoded, layout)
            return found, _absent(keys, again, named)
        return found, [str(k) for k in keys] if named else []

    def take(self, rows: npt.ArrayLike, out: npt.NDArray[Any] | None = None) -> Any:
        """Gather rows into one contiguous ``(B, *item_shape)`` array.

        Of a store of records: a dict of every field's batch, in schema order
        (fixed fields ``(B, *shape)``, ``(B,)`` for scalars; ragged fields a
        :class:`~tensorstore_cache.format.fields.Ragged` batch; text fields a
        ``list`` of ``str``). One gather per field; batches are copies.

        Parameters
        ----------
        rows
            Row numbers (from :meth:`rows`), any order, repeats allowed.
        out
            Optional preallocated C-contiguous array of shape ``(B, *item_shape)``
            and the store's dtype, filled in place (e.g. ``tensor.numpy()``);
            a store of tensors (or a fixed field) only.

        Returns
        -------
        numpy.ndarray, Ragged, list of str or dict
            ``out`` if given, else a new array (or the batch of each field).
        """
        self._check_open()
        idx = np.asarray(rows)
        if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.size == 0):
            raise TypeError(f"rows must be a 1-D array of integers, got shape {idx.shape} {idx.dtype}")
        n = len(self)
        if idx.dtype.kind == "u" and idx.size and int(idx.max()) >= n:  # before a cast wraps it
            raise IndexError(f"row {int(idx.max())} is out of range for a store of {n} rows")
        idx = idx.astype(np.int64, copy=False)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            bad = idx[(idx < 0) | (idx >= n)][0]
            raise IndexError(f"row {int(bad)} is out of range for a store of {n} rows")
        if self._kind != "fixed":
            if out is not None:
                raise TypeError(
                    "take(out=) fills an array of one fixed shape; a store of records (or a "
                    "ragged field) has none: use store.field(name).take(rows, out=) of a fixed field"
                )
            if self._field is None:
                return {name: self._take_field(name, idx) for name in self._layouts}
            return self._take_field(self._field, idx)
        assert self._item_shape is not None and self._dtype is not None
        shape = (len(idx), *self._item_shape)
        if out is None:
            out = np.empty(shape, dtype=self._dtype)
        else:
            if out.shape != shape or out.dtype != self._dtype or not out.flags.c_contiguous:
                raise ValueError(
                    f"out must be a C-contiguous {self._dtype} array of shape {shape}, got "
                    f"{out.dtype} {out.shape}"
                )
            if not out.flags.writeable:
                raise ValueError("out is read-only")
        if len(idx):
            assert self._field is not None
            self._overlay.gather(idx, out, self._field)
        return out

    def gather_values(
        self, name: str, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """``(values, offsets from 0, shapes or None)`` of ragged or text field ``name`` of
        valid ``rows``: the raw arrays (text as its UTF-8 bytes), one gather."""
        self._check_open()
        layout = self._layouts[name]
        if isinstance(layout.field, Fixed):
            raise TypeError(f"field {name!r} is fixed; gather it with take()")
        if len(rows) == 0:
            f = layout.field
            shapes = (np.empty((0, len(f.varying)), np.int64)
                      if isinstance(f, Ragged) and f.flat else None)
            return np.empty((0, *f.inner), np.dtype(f.dtype)), np.zeros(1, np.int64), shapes
        return self._overlay.gather_ragged(rows, name)

    def value_lengths(self, name: str, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """How many rows of ``values`` each of valid ``rows`` has in ragged or text field
        ``name`` (from the offsets alone)."""
        self._check_open()
        out = np.empty(len(rows), np.int64)
        seg_of, local = self._overlay.locate(np.asarray(rows, np.int64))
        for k in distinct(seg_of):
            sel = np.flatnonzero(seg_of == k)
            start, stop = self._overlay.segments[k].ragged(name).spans(local[sel])
            out[sel] = stop - start
        return out

    def lengths(self, name: str, rows: npt.ArrayLike | None = None) -> npt.NDArray[np.int64]:
        """Every row's length in ragged or text field ``name``, from its offsets (and shapes)
        alone: no values are read (nor fetched, for a store opened from a URL).

        A row's length is its size along the field's first varying dimension
        (``Ragged.lengths`` of a batch); a text field's, its UTF-8 bytes.

        Parameters
        ----------
        name
            A ragged or text field of a store of records.
        rows
            Row numbers (default: every row).

        Examples
        --------
        >>> store.lengths("title_ids").max()  # doctest: +SKIP
        60
        """
        self._check_open()
        layout = self._layouts.get(name) if self._records else None
        if layout is None or isinstance(layout.field, Fixed):
            ragged = [n for n, f in self._layouts.items() if not isinstance(f.field, Fixed)]
            raise TypeError(
                f"lengths() needs a ragged or text field of a store of records; "
                f"{self._location!r} has {ragged or 'none'}"
            )
        idx = np.arange(len(self), dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        n = len(self)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"a row of rows is out of range for a store of {n} rows")
        out = np.empty(len(idx), np.int64)
        seg_of, local = self._overlay.locate(idx)
        for k in distinct(seg_of):
            sel = np.flatnonzero(seg_of == k)
            array = self._overlay.segments[k].ragged(name)
            start, stop = array.spans(local[sel])
            out[sel] = stop - start if array.shapes is None else array.shapes[local[sel], 0]
        return out

    def _take_field(self, name: str, idx: npt.NDArray[np.int64]) -> Any:
        """One field's batch of valid rows ``idx``."""
        layout = self._layouts[name]
        f = layout.field
        if isinstance(f, Fixed):
            out = np.empty((len(idx), *f.shape), dtype=np.dtype(f.dtype))
            if len(idx):
                self._overlay.gather(idx, out, name)
            return out
        values, offsets, shapes = self.gather_values(name, idx)
        if isinstance(f, Text):
            raw = values.tobytes()
            bounds = offsets.tolist()
            return [raw[a:b].decode("utf-8", "surrogateescape")
                    for a, b in itertools.pairwise(bounds)]
        return f.of_arrays(values, offsets, shapes)

    def stale(
        self,
        paths: Iterable[str | os.PathLike[str]] | None = None,
        *,
        check: Check | None = None,
        identity: Identity | None = None,
    ) -> list[str]:
        """Return the keys whose source changed since its vector was computed.

        Parameters
        ----------
        paths
            The paths to check (default: every key of the store). Paths that
            are not in the store are not reported.
        check
            By default (neither ``check`` nor ``identity`` given) each entry is
            judged the way it was recorded: by ``"stat"``, and never stale if
            it was built with ``identity="none"``.
            ``"stat"``: a source is stale when its size or
            modification time (ns) differs from the one recorded before it
            was read, or it no longer exists; an entry whose source had been
            modified just before it was read (racily clean) is also compared
            by content while its size and time match. ``"hash"``: when its
            content hash differs from the recorded one (entries built
            without a hash fall back to ``"stat"``); reads every source.
        identity
            The newer name of ``check`` (``"content"`` for ``"hash"``), or
            ``"none"`` (nothing is stale) or a function of the keys giving their
            version tokens (an entry is stale when its token changed). Entries
            recorded under another kind are reported stale.

        Returns
        -------
        list of str
            The stale keys, in the order checked.

        Examples
        --------
        >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
        >>> _ = open(paths[3], "ab").write(b"changed")
        >>> store.stale() == [paths[3]]
        True
        """
        self._check_open()
        kind, token_fn = resolve_identity(identity, check)
        if kind == "none":
            return []
        as_recorded = identity is None and check is None
        if as_recorded and all(seg.spec.identity == "none" for seg in self.segments):
            return []  # built with identity="none": nothing is ever stale
        keys = self.paths if paths is None else list(dict.fromkeys(normalize_keys(paths)))
        rows = self.rows(keys, missing="ignore")
        present = np.flatnonzero(rows >= 0)
        recorded = self.source_identity(rows[present], content_hash=kind != "token")
        if as_recorded:  # each entry judged the way it was recorded
            kinds = recorded.recorded
            assert kinds is not None
            if bool(np.any(kinds == "token")):
                raise TypeError(
                    f"entries of {self._location!r} were recorded with version tokens: pass "
                    "identity=<the function of the keys giving their tokens> to check them"
                )
            judged = np.flatnonzero(kinds != "none")
            present = present[judged]
            recorded = recorded.take(judged)
        found = [keys[i] for i in present.tolist()]
        tokens = None
        if token_fn is not None:
            by_key = token_map(found, token_fn)
            tokens = np.array([by_key[k] for k in found], np.uint64)
        mask = stale_mask(found, recorded, check=kind, tokens=tokens)
        return [found[i] for i in np.flatnonzero(mask).tolist()]

    # -- integrity ------------------------------------------------------------

    def verify(self) -> None:
        """Re-read every file of the store and compare it with the checksums of the build.

        Checks each segment's metadata, the size and XXH3-128 of every data
        and index file, and that no file is missing and none was added. It
        reads the whole store once (at disk speed) and changes nothing. A
        store opened from a URL first fetches the shards it does not have yet
        (each checked as it arrives; under a cap, only what fits).

        Raises
        ------
        CorruptStoreError
            Naming every damaged, missing or unexpected file (``.files``).

        Examples
        --------
        >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
        >>> tsc.open_store("covers.tsc").verify()  # silent: every file is as built
        """
        self._check_open()
        for seg in self.segments:  # shards fetched on demand: fetch (and check) the rest first
            seg.prefetch(None)
        self.report().raise_if_bad()

    def report(self) -> VerifyReport:
        """What :meth:`verify` finds, as a report: every file checked against its recorded
        size and XXH3-128 and, when they are sound, every row's offsets (and shapes) of every
        ragged or text field."""
        self._check_open()
        report = verify_segments(self._location, self.segments)
        if report.ok:
            for seg in self.segments:
                for array in seg.arrays.values():
                    if isinstance(array, RaggedArray):
                        try:
                            array.check()
                        except CorruptStoreError as exc:
                            report.problems.append(
                                Problem(exc.path or str(seg.root), "offsets", str(exc)))
        return report

    # -- shards on demand -----------------------------------------------------

    def prefetch(
        self, rows: npt.ArrayLike | None = None, *, background: bool = False
    ) -> Future[int]:
        """Fetch ahead the shards of ``rows`` (all shards if None) of a store opened from a URL.

        A store opened from a URL (or a path on a network filesystem) fetches
        each shard into the node cache the first time one of its rows is
        read; this fetches them before, a few at a time. Under a cap
        (``max_bytes``) it fetches only what fits, never evicting to make
        room, and says once how much did not fit. A local store has nothing
        to fetch.

        Parameters
        ----------
        rows
            Row numbers whose shards to fetch (default: every shard).
        background
            Return at once and fetch in a background thread.

        Returns
        -------
        concurrent.futures.Future
            Of the number of shards downloaded by this call; done on return
            unless ``background`` (errors are then raised by ``.result()``).

        Examples
        --------
        >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
        >>> store = tsc.open_store("covers.tsc", local_copy="always")  # as a URL is read
        >>> store.prefetch(store.rows(paths[:2])).result()  # shards fetched
        1
        """
        self._check_open()
        seg_of: npt.NDArray[np.intp] | None = None
        local: npt.NDArray[np.int64] | None = None
        if rows is not None:
            idx = np.asarray(rows, dtype=np.int64)
            n = len(self)
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
                raise IndexError(f"a row of rows is out of range for a store of {n} rows")
            seg_of, local = self._overlay.locate(idx)
        done: list[Future[int]] = []
        for i, seg in enumerate(self.segments):
            mine = None if local is None or seg_of is None else local[seg_of == i]
            done.append(seg.prefetch(mine, background=background))
        if len(done) == 1:
            return done[0]
        total: Future[int] = Future()
        total.set_result(sum(f.result() for f in done))
        return total

    @property
    def fetch_stats(self) -> FetchStats | None:
        """What this handle fetched into the node cache (None for a local store)."""
        for seg in self.segments:
            if seg.supply is not None:
                return seg.supply.stats
        return None

    # -- pandas and batches -----------------------------------------------------

    def series(
        self, paths: Iterable[str | os.PathLike[str]], *, name: Hashable | None = None
    ) -> pd.Series[Any]:
        """Return the vector of every path as a pandas Series aligned to ``paths``.

        The drop-in for a column of vectors: ``df["img_vector"] =
        store.series(df["img_path"])`` gives every row the vector of its own
        path, whatever the order, filtering or repeats of ``df``.

        Parameters
        ----------
        paths
            A pandas Series of paths (its index is kept), or any iterable of
            paths (the result then has a RangeIndex). Repeats allowed.
        name
            Name of the returned Series.

        Returns
        -------
        pandas.Series
            ``object`` dtype; element ``i`` is the ``(C, H, W)`` copy-on-write
            view of the store's vector of ``paths[i]`` (zero-copy, shared with
            every process mapping the store; copy it before writing to it); of
            a store of records, its :class:`~tensorstore_cache.reader.record.Record`.

        Raises
        ------
        KeyNotInStoreError
            Naming every path that is not in the store.

        Notes
        -----
        The column holds NumPy views of the mapped files, as an ``img_vector``
        column of one array per row would, without copying a byte. A pandas
        extension type for tensors (e.g. pyarrow's fixed-shape tensor) would
        copy every vector into Arrow memory, private to each process; the
        views stay in the OS page cache, shared by every process that opens
        the store. pandas is imported only here.

        Examples
        --------
        >>> import pandas as pd
        >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
        >>> df = pd.DataFrame({"img_path": [paths[2], paths[0], paths[2]]}, index=[7, 8, 9])
        >>> df["img_vector"] = store.series(df["img_path"])  # each row its own vector
        >>> df["img_vector"][9].shape
        (3, 32, 32)
        """
        import pandas as pd

        index: pd.Index[Any] | None = paths.index if isinstance(paths, pd.Series) else None
        rows = self.rows(paths)
        unique, inverse = np.unique(rows, return_inverse=True)
        views = np.empty(len(unique), dtype=object)
        for i, row in enumerate(unique.tolist()):  # one view per distinct path
            views[i] = self.vector(row)
        values = views[inverse.reshape(-1)]
        return pd.Series(values, index=index, name=name, dtype=object, copy=False)

    def stack(
        self, paths: Iterable[str | os.PathLike[str]], out: npt.NDArray[Any] | None = None
    ) -> Any:
        """Return the vectors of ``paths`` as one ``(B, *item_shape)`` array, in order.

        ``store.stack(paths)`` is ``store.take(store.rows(paths), out)``.

        Examples
        --------
        >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
        >>> store.stack([paths[1], paths[1], paths[0]]).shape
        (3, 3, 32, 32)
        """
        return self.take(self.rows(paths), out=out)

    def frame(
        self, paths: Iterable[str | os.PathLike[str]], fields: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Return the records of ``paths`` as a pandas DataFrame, one column per field.

        Its index is the paths. A fixed scalar field is a numeric column; every
        other fixed or ragged field an ``object`` column of copy-on-write views
        (no copy); a text field a column of ``str``.

        Parameters
        ----------
        paths
            Paths of the store, any order, repeats allowed.
        fields
            The columns (default: every field, in schema order).

        Examples
        --------
        >>> loader = lambda p: {"image": tsc.ImageLoader(dtype="uint8")(p), "name": p}
        >>> store = tsc.build_store(paths, "records.tsc", loader=loader,
        ...                         loader_id="demo.named/1", progress=False)
        >>> frame = store.frame(paths)
        >>> frame.columns.tolist(), frame["name"].tolist() == paths
        (['image', 'name'], True)
        """
        import pandas as pd

        if not self._records or self._field is not None:
            raise TypeError("frame() is a DataFrame of a store of records; use series() here")
        names = list(self._layouts) if fields is None else list(fields)
        for name in names:
            if name not in self._layouts:
                raise KeyError(f"no field {name!r}; the fields are {list(self._layouts)}")
        keys = path_sequence(paths)
        rows = self.rows(keys)
        unique, inverse = np.unique(rows, return_inverse=True)
        inverse = inverse.reshape(-1)
        columns: dict[str, Any] = {}
        for name in names:
            f = self._layouts[name].field
            if isinstance(f, Fixed) and f.shape == ():
                columns[name] = self._take_field(name, rows)
                continue
            view = self.field(name)
            values = np.empty(len(unique), dtype=object)
            for i, row in enumerate(unique.tolist()):
                values[i] = view.vector(row)
            columns[name] = values[inverse]
        index = pd.Index([str(k) for k in keys], name="path")
        return pd.DataFrame(columns, index=index, copy=False)

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Release the mappings. Views already returned stay valid.

        A field of a store (:meth:`field`) shares the store's mappings: closing
        it closes only the field's handle.
        """
        if not self._closed and self._parent is None:
            for seg in self.segments:
                seg.close()
            for res in self._resources:
                res.close()
            self._resources = []
        self._closed = True

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # A store pickles as its location: the receiving process maps the same files
        # (a cache namespace pins the parts this handle sees, so rows keep their meaning).
        if self._records and self._field is not None:
            return (open_field, (self._where, self._field))
        return (open_location, (self._where,))


def _step(values: Sequence[Any]) -> int:
    """Paths per step of :meth:`CacheStore.rows`: :data:`_ROWS_CHUNK`, fewer for long paths
    (their mean length estimated from a sample), so a step's paths hold about
    :data:`_ROWS_BYTES` at most."""
    sample = [v for v in values[:: max(1, len(values) // 16)][:16] if isinstance(v, str)]
    if not sample:
        return _ROWS_CHUNK
    mean = sum(map(len, sample)) / len(sample)
    return max(64, min(_ROWS_CHUNK, int(_ROWS_BYTES // max(mean + 1.0, 1.0))))


def _absent(keys: Sequence[Any], found: npt.NDArray[np.int64], named: bool) -> list[str]:
    """The keys not found (``found < 0``), if they are to be ``named``."""
    if not named:
        return []
    return [str(keys[i]) for i in np.flatnonzero(found < 0).tolist()]


def _repeats(values: Sequence[Any]) -> bool:
    """Whether a sample of about :data:`_ROWS_CHUNK` of ``values``, evenly spaced, repeats a
    value (paths of a ratings table do; distinct keys never cost a dict of them all)."""
    sample = values[:: len(values) // _ROWS_CHUNK]
    try:
        return len(set(sample)) < len(sample)
    except TypeError:  # an unhashable item: looked up (and refused) as it is
        return False


def open_field(where: Location, name: str) -> CacheStore:
    """Open field ``name`` of the store at ``where`` (how a pickled field is opened again)."""
    return where.open().field(name)


def _combined_spec(overlay: Overlay) -> StoreSpec:
    """The spec of a store of several segments: ``n`` live rows, sources still skipped."""
    segments = overlay.segments
    biggest = max(segments, key=lambda s: s.n)
    skipped: dict[str, str] = {}
    for seg in segments:
        for key, reason in seg.spec.skipped:
            if overlay.find(key)[0] < 0:  # no segment holds it (a later build may have)
                skipped[key] = reason
    return dataclasses.replace(
        biggest.spec,
        n=overlay.n,
        skipped=tuple(skipped.items()),
        created_unix=max(seg.spec.created_unix for seg in segments),
    )
