"""The handle: :class:`CacheStore`, over one store directory or several segments."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ..config import Identity, Missing
from ..errors import CorruptStoreError, KeyNotInStoreError
from ..format import (
    Problem,
    StoreSpec,
    VerifyReport,
    hash_key,
    normalize_key,
    normalize_keys,
    verify_segments,
)
from . import frames, gather
from .lookup import find_rows
from .overlay import Overlay
from .ragged import RaggedArray
from .segment import Segment
from .sources import resolve_identity, token_map
from .staleness import stale_keys
from .supply import FetchStats
from .view import StoreView

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CacheStore", "Location", "open_field", "open_location", "view_of"]

_T = TypeVar("_T")
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

    Examples
    --------
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> with tsc.open_store("covers.tsc") as store:
    ...     v = store[paths[0]]                    # (3, 32, 32) float32 view
    ...     batch = store.take(store.rows(paths))  # (B, 3, 32, 32) array
    ...     print(v.shape, batch.shape, paths[0] in store, store.get("no/such.jpg"))
    (3, 32, 32) (8, 3, 32, 32) True None
    """

    _view: StoreView

    def __init__(
        self,
        segments: Sequence[Segment],
        where: Location,
        *,
        spec: StoreSpec | None,
        resources: Sequence[Any] = (),
        parent: CacheStore | None = None,
        field: str | None = None,
    ) -> None:
        """Built by the reader alone (:func:`~tensorstore_cache.reader.assembly.assemble`).

        Parameters
        ----------
        segments
            The mapped store directories, oldest first.
        where
            The store's location (what it pickles as).
        spec
            The store's spec, or None to combine the segments' when first asked for.
        resources
            What is closed with the store (e.g. readers' locks).
        parent
            The store of records whose field this is: its mappings are shared.
        field
            With ``parent``: the field read.
        """
        first = spec if spec is not None else segments[0].spec
        records = first.records
        if parent is None:
            overlay = Overlay(segments)
            layouts = {f.name: f for f in first.layouts()}
            field = None if records else "vectors"
        else:
            overlay, layouts = parent._view.overlay, parent._view.layouts
        self._view = StoreView(overlay, layouts, records=records, field=field,
                               location=where.shown)
        self._spec = spec  # None: combined from the segments when first asked for
        self._where = where
        self._location = where.shown
        self._paths: list[str] | None = None
        self._resources = list(resources)  # closed with the store (e.g. readers' locks)
        self._parent = parent
        # the fast paths of store[path] on a store of one segment: a fixed field, or records
        one = segments[0] if len(segments) == 1 else None
        kind = self._view.kind
        self._single = one.fixed(field) if one is not None and kind == "fixed" and field else None
        self._single_record = one.record if one is not None and kind == "record" else None
        fast = self._single is not None or self._single_record is not None
        self._single_find = one.keys.find if one is not None and fast else None

    def field(self, name: str) -> CacheStore:
        """Field ``name`` of a store of records, as a store of its own.

        A fixed field has the whole API of a store of one tensor per key
        (``store[p]``, ``rows``, ``take``, ``stack``, ``series``...); a ragged
        field's ``store[p]`` is a view of its row and ``take`` a
        :class:`~tensorstore_cache.format.fields.Ragged` batch; a text field's
        values are ``str``. It shares this store's mappings: it stays usable
        while this store is open.

        Parameters
        ----------
        name
            A field of the store's schema (``spec.fields``).

        Examples
        --------
        >>> loader = lambda p: {"image": tsc.ImageLoader(dtype="uint8")(p), "name": p}
        >>> store = tsc.build_store(paths, "records.tsc", loader=loader,
        ...                         loader_id="demo.named/1", progress=False)
        >>> images = store.field("image")
        >>> images.take(images.rows(paths)).shape
        (8, 3, 32, 32)
        """
        view = self._view
        view.check_open()
        if name not in view.layouts or not view.records:
            known = list(view.layouts) if view.records else []
            raise KeyError(
                f"{self._location!r} has no field {name!r}"
                + (f"; its fields are {known}" if known else " (it holds one tensor per key)")
            )
        return CacheStore(view.segments, self._where, spec=self._spec, parent=self, field=name)

    # -- description ----------------------------------------------------------

    @property
    def records(self) -> bool:
        """Whether ``store[p]`` is a record (a store of records; not one of its fields)."""
        return self._view.kind == "record"

    @property
    def fixed(self) -> bool:
        """Whether every value has one shape and dtype (a store of one tensor per key, or a
        fixed field of records): the API of arrays (``take(out=)``, ``shape``...) applies."""
        return self._view.kind == "fixed"

    @property
    def spec(self) -> StoreSpec:
        """The store's :class:`StoreSpec` (``n`` counts distinct keys).

        A field of a store of records (:meth:`field`) has the store's spec with
        the field's ``item_shape`` (fixed fields) and ``dtype``.
        """
        if self._spec is None:
            self._spec = _combined_spec(self._view.overlay)
        view = self._view
        if view.records and view.field is not None:
            return dataclasses.replace(self._spec, item_shape=view.item_shape,
                                       dtype=None if view.dtype is None else view.dtype.name)
        return self._spec

    @property
    def location(self) -> str:
        """Where the store lives (a directory)."""
        return self._location

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len(store), *item_shape)`` (of a fixed field; a store of records: ``(len,)``)."""
        return (len(self), *(self._view.item_shape or ()))

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the vectors (of the field, for a field of records)."""
        if self._view.dtype is None:
            raise TypeError(
                f"{self._location!r} holds records, whose fields have their own dtypes "
                "(spec.fields); use store.field(name).dtype"
            )
        return self._view.dtype

    @property
    def paths(self) -> list[str]:
        """Every key, in row order (``store.paths[i]`` is the key of row ``i``)."""
        self._view.check_open()
        if self._paths is None:
            self._paths = self._view.overlay.paths()
        return self._paths

    def __len__(self) -> int:
        return self._view.overlay.n

    def __repr__(self) -> str:
        view = self._view
        if view.closed:
            state = "closed"
        elif view.kind == "record":
            state = f"{len(self)} records of {', '.join(view.layouts)}"
        else:
            shape = view.item_shape if view.kind == "fixed" else view.kind
            state = f"{len(self)} x {shape} {self.dtype.name}"
            state = state if view.field == "vectors" else f"field {view.field!r}: {state}"
        return f"<CacheStore {self._location!r}: {state}>"

    # -- lookups --------------------------------------------------------------

    def __getitem__(self, path: str | os.PathLike[str]) -> Any:
        """Return the vector of ``path`` as a copy-on-write view (a Record for records).

        A store opened from a URL with a cap of its node cache (``max_bytes``,
        ``$TSC_CACHE_MAX_BYTES`` or a cap recorded in the cache) returns a copy
        instead: it unmaps shards it no longer uses, and a view could point into
        one of them.
        """
        view = self._view
        if view.closed:
            view.check_open()
        find = self._single_find
        if find is not None and type(path) is str:  # the one fast path, measured
            # Stored keys are normalised and normalising is idempotent, so a path found as
            # it is needs no normalising; any other path is looked up normalised below.
            encoded = path.encode("utf-8", "surrogateescape")  # encode_key, inlined
            row = find(encoded, hash_key(encoded))
            if row >= 0:
                record = self._single_record
                if record is not None:
                    return record(row)
                single = self._single
                assert single is not None
                every = single.all_rows  # FixedArray.row, inlined for the common case
                return every[row, ...] if every is not None else single.row(row)
        key = normalize_key(path)
        k, local = view.overlay.find(key)
        if k < 0:
            raise KeyNotInStoreError([key])
        return view.value(k, local)

    @overload
    def get(self, path: str | os.PathLike[str]) -> Any | None: ...
    @overload
    def get(self, path: str | os.PathLike[str], default: _T) -> Any | _T: ...
    def get(self, path: str | os.PathLike[str], default: Any = None) -> Any:
        """Return the vector (or record) of ``path``, or ``default`` when it is not stored.

        Parameters
        ----------
        path
            A key of the store (normalised as stored keys are).
        default
            What to return when ``path`` is not stored.
        """
        self._view.check_open()
        k, local = self._view.overlay.find(normalize_key(path))
        return default if k < 0 else self._view.value(k, local)

    def __contains__(self, path: object) -> bool:
        self._view.check_open()
        try:
            key = normalize_key(path)
        except (TypeError, ValueError):
            return False
        return self._view.overlay.find(key)[0] >= 0

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
        self._view.check_open()
        return find_rows(self._view.overlay, paths, missing)

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
            ``out`` if given, else a new array (or the batch of each field); a new
            batch of a fixed field of at least 1 MiB starts on a 64-byte cache line
            (a view of a block slightly larger, its ``base``), where copying rows
            into it runs fastest.
        """
        self._view.check_open()
        return gather.take(self._view, rows, out)

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
        self._view.check_open()
        return gather.lengths(self._view, name, rows)

    def stale(
        self,
        paths: Iterable[str | os.PathLike[str]] | None = None,
        *,
        identity: Identity | None = None,
    ) -> list[str]:
        """Return the keys whose source changed since its vector was computed.

        Parameters
        ----------
        paths
            The paths to check (default: every key of the store). Paths that
            are not in the store are not reported.
        identity
            By default each entry is judged the way it was recorded: by
            ``"stat"``, and never stale if it was built with ``identity="none"``.
            ``"stat"``: a source is stale when its size or modification time
            (ns) differs from the one recorded before it was read, or it no
            longer exists; an entry whose source had been modified just before
            it was read (racily clean) is also compared by content while its
            size and time match. ``"content"``: when its content hash differs
            from the recorded one (entries built without a hash fall back to
            ``"stat"``); reads every source. ``"none"``: nothing is stale. A
            function of the keys giving their version tokens: an entry is stale
            when its token changed. Entries recorded under another kind are
            reported stale.

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
        self._view.check_open()
        kind, token_fn = resolve_identity(identity)
        keys = self.paths if paths is None else list(dict.fromkeys(normalize_keys(paths)))
        rows = find_rows(self._view.overlay, keys, "ignore")
        tokens = None if token_fn is None else (lambda found: token_map(found, token_fn))
        return stale_keys(self._view, keys, rows, kind=None if identity is None else kind,
                          tokens=tokens)

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
        self._view.check_open()
        for seg in self._view.segments:  # shards fetched on demand: fetch (and check) the rest first
            seg.prefetch(None)
        self.report().raise_if_bad()

    def report(self) -> VerifyReport:
        """What :meth:`verify` finds, as a report: every file checked against its recorded
        size and XXH3-128 and, when they are sound, every row's offsets (and shapes) of every
        ragged or text field."""
        self._view.check_open()
        segments = self._view.segments
        report = verify_segments(self._location, segments)
        if report.ok:
            for seg in segments:
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
        self._view.check_open()
        seg_of: npt.NDArray[np.intp] | None = None
        local: npt.NDArray[np.int64] | None = None
        if rows is not None:
            idx = np.asarray(rows, dtype=np.int64)
            n = len(self)
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
                raise IndexError(f"a row of rows is out of range for a store of {n} rows")
            seg_of, local = self._view.locate(idx)
        done: list[Future[int]] = []
        for i, seg in enumerate(self._view.segments):
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
        for seg in self._view.segments:
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
        return frames.series(self._view, paths, name)

    def stack(
        self, paths: Iterable[str | os.PathLike[str]], out: npt.NDArray[Any] | None = None
    ) -> Any:
        """Return the vectors of ``paths`` as one ``(B, *item_shape)`` array, in order.

        ``store.stack(paths)`` is ``store.take(store.rows(paths), out)``.

        Parameters
        ----------
        paths
            Paths of the store, any order, repeats allowed.
        out
            Optional preallocated array to fill, as :meth:`take`'s.

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
        return frames.frame(self._view, paths, fields)

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Release the mappings. Views already returned stay valid.

        A field of a store (:meth:`field`) shares the store's mappings: closing
        it closes only the field's handle.
        """
        view = self._view
        if not view.closed and self._parent is None:
            for seg in view.segments:
                seg.close()
            for res in self._resources:
                res.close()
            self._resources = []
        view.closed = True

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
        if self._view.records and self._view.field is not None:
            return (open_field, (self._where, self._view.field))
        return (open_location, (self._where,))


def view_of(store: CacheStore) -> StoreView:
    """The store as the library's own layers see it: its segments, where a row lies, one
    row's value, what was recorded about its sources, the raw arrays of ragged fields.

    Parameters
    ----------
    store
        An open store (or a field of one).
    """
    return store._view


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
