"""The handle: :class:`CacheStore`, over one store directory or several segments."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np
import numpy.typing as npt
import xxhash

from ..config import Check, Missing, check_mode
from ..errors import KeyNotInStoreError, StoreNotFoundError
from ..format.keys import encode_keys, normalize_key, normalize_keys, path_sequence
from ..format.spec import StoreSpec
from ..format.verify import verify_segments
from .overlay import Overlay
from .segment import Segment, ShardSupply
from .sources import SourceIdentity, stale_mask

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CacheStore", "open_directory"]

_T = TypeVar("_T")
#: Keys looked up per vectorised step of :meth:`CacheStore.rows`.
_ROWS_CHUNK = 4096


class CacheStore:
    """A read-only, memory-mapped store of fixed-shape vectors keyed by path.

    Obtain one with :func:`open_store`, :func:`build_store` or
    :func:`cached`. It behaves like a read-only mapping from path to vector:
    ``store[path]`` raises :class:`KeyNotInStoreError` on a miss, ``.get``
    does not, ``path in store`` and ``len(store)`` work, and it is a context
    manager. Vectors are views of the mapped files (copy-on-write: writing to
    one changes only this process's copy, never the file).

    A store is made of one or more segments (store directories; a cache
    namespace has one per part), later segments overriding earlier ones.
    :attr:`segments`, :meth:`locate`, :meth:`vector` and
    :meth:`source_identity` are the interface the library's own layers use.

    Examples
    --------
    >>> with open_store("covers.tsc") as store:  # doctest: +SKIP
    ...     v = store["data/images/0001.jpg"]      # (3, 32, 32) float32 view
    ...     batch = store.take(store.rows(paths))  # (B, 3, 32, 32) array
    """

    def __init__(
        self,
        segments: Sequence[Segment],
        spec: StoreSpec,
        location: str,
        *,
        reopen: tuple[Callable[..., CacheStore], tuple[Any, ...]] | None = None,
        resources: Sequence[Any] = (),
    ) -> None:
        self._overlay = Overlay(segments)
        # the one fast path: store[path] on a store of one segment
        self._single = segments[0] if len(segments) == 1 else None
        self._spec = spec
        self._location = location
        self._closed = False
        self._dtype = np.dtype(spec.dtype)
        self._paths: list[str] | None = None
        self._reopen = reopen
        self._resources = list(resources)  # closed with the store (e.g. readers' locks)

    # -- description ----------------------------------------------------------

    @property
    def spec(self) -> StoreSpec:
        """The store's :class:`StoreSpec` (``n`` counts distinct keys)."""
        n = self._overlay.n
        if self._spec.n != n and len(self._overlay.segments) > 1:
            self._spec = dataclasses.replace(self._spec, n=n)
        return self._spec

    @property
    def location(self) -> str:
        """Where the store lives (a directory)."""
        return self._location

    @property
    def shape(self) -> tuple[int, ...]:
        """``(len(store), *item_shape)``."""
        return (len(self), *self._spec.item_shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the vectors."""
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
        state = "closed" if self._closed else f"{len(self)} x {self._spec.item_shape} {self._spec.dtype}"
        return f"<CacheStore {self._location!r}: {state}>"

    # -- the interface of the library's own layers --------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The mapped store directories, oldest first (later ones override earlier ones)."""
        return self._overlay.segments

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """Map valid rows to ``(segment index, local row in that segment)`` arrays."""
        return self._overlay.locate(rows)

    def vector(self, row: int) -> npt.NDArray[Any]:
        """Return the vector of ``row`` as a copy-on-write view of the mapped file."""
        if self._closed:
            self._check_open()
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} is out of range for a store of {len(self)} rows")
        k, local = self._overlay.locate_one(row)
        return self._overlay.segments[k].row(local)

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
        for k in np.unique(seg_of).tolist():
            sel = np.flatnonzero(seg_of == k)
            seg = self.segments[k]
            size[sel] = seg.source_size[local[sel]]
            mtime[sel] = seg.source_mtime_ns[local[sel]]
            recorded = seg.content_hashes() if hashes is not None else None
            if hashes is not None and recorded is not None:
                hashes[sel] = recorded[local[sel]]
        return SourceIdentity(size, mtime, hashes)

    # -- lookups --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self._location!r} is closed")

    def __getitem__(self, path: str | os.PathLike[str]) -> npt.NDArray[Any]:
        """Return the vector of ``path`` as a copy-on-write view."""
        if self._closed:
            self._check_open()
        single = self._single
        if single is not None and type(path) is str:  # the one fast path, measured
            # Stored keys are normalised and normalising is idempotent, so a path found as
            # it is needs no normalising; any other path is looked up normalised below.
            encoded = path.encode("utf-8", "surrogateescape")
            row = single.find(encoded, xxhash.xxh3_64_intdigest(encoded))
            if row >= 0:
                return single.row(row)
        key = normalize_key(path)
        k, local = self._overlay.find(key)
        if k < 0:
            raise KeyNotInStoreError([key])
        return self._overlay.segments[k].row(local)

    @overload
    def get(self, path: str | os.PathLike[str]) -> npt.NDArray[Any] | None: ...
    @overload
    def get(self, path: str | os.PathLike[str], default: _T) -> npt.NDArray[Any] | _T: ...
    def get(self, path: str | os.PathLike[str], default: Any = None) -> Any:
        """Return the vector of ``path``, or ``default`` when it is not stored."""
        self._check_open()
        k, local = self._overlay.find(normalize_key(path))
        return default if k < 0 else self._overlay.segments[k].row(local)

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
        out = np.empty(len(values), dtype=np.int64)
        missing_keys: list[str] = []
        # In chunks: the temporaries of a lookup grow with the keys' bytes, and a
        # process keeps freed heap, so one huge call would cost memory for good.
        for start in range(0, len(values), _ROWS_CHUNK):
            keys, encoded = encode_keys(values[start : start + _ROWS_CHUNK])
            found = self._overlay.find_many(encoded)
            out[start : start + len(encoded)] = found
            if missing == "raise" and not bool(found.min(initial=0) >= 0):
                missing_keys.extend(str(keys[i]) for i in np.flatnonzero(found < 0).tolist())
        if missing_keys:
            raise KeyNotInStoreError(missing_keys)
        return out

    def take(self, rows: npt.ArrayLike, out: npt.NDArray[Any] | None = None) -> npt.NDArray[Any]:
        """Gather rows into one contiguous ``(B, *item_shape)`` array.

        Parameters
        ----------
        rows
            Row numbers (from :meth:`rows`), any order, repeats allowed.
        out
            Optional preallocated C-contiguous array of shape ``(B, *item_shape)``
            and the store's dtype, filled in place (e.g. ``tensor.numpy()``).

        Returns
        -------
        numpy.ndarray
            ``out`` if given, else a new array.
        """
        self._check_open()
        idx = np.asarray(rows)
        if idx.ndim != 1 or not (idx.dtype.kind in "iu" or idx.size == 0):
            raise TypeError(f"rows must be a 1-D array of integers, got shape {idx.shape} {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        n = len(self)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            bad = idx[(idx < 0) | (idx >= n)][0]
            raise IndexError(f"row {int(bad)} is out of range for a store of {n} rows")
        shape = (len(idx), *self._spec.item_shape)
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
            self._overlay.gather(idx, out)
        return out

    def stale(
        self, paths: Iterable[str | os.PathLike[str]] | None = None, *, check: Check = "stat"
    ) -> list[str]:
        """Return the keys whose source changed since its vector was computed.

        Parameters
        ----------
        paths
            The paths to check (default: every key of the store). Paths that
            are not in the store are not reported.
        check
            ``"stat"`` (default): a source is stale when its size or
            modification time (ns) differs from the one recorded at build
            time, or it no longer exists. ``"hash"``: when its content hash
            differs from the recorded one (entries built without a hash fall
            back to ``"stat"``); reads every source.

        Returns
        -------
        list of str
            The stale keys, in the order checked.

        Examples
        --------
        >>> store.stale()  # doctest: +SKIP
        ['data/images/0007.jpg']
        """
        self._check_open()
        check_mode("check", check, Check)
        keys = self.paths if paths is None else list(dict.fromkeys(normalize_keys(paths)))
        rows = self.rows(keys, missing="ignore")
        present = np.flatnonzero(rows >= 0)
        found = [keys[i] for i in present.tolist()]
        recorded = self.source_identity(rows[present], content_hash=check == "hash")
        mask = stale_mask(found, recorded)
        return [found[i] for i in np.flatnonzero(mask).tolist()]

    # -- integrity ------------------------------------------------------------

    def verify(self) -> None:
        """Re-read every file of the store and compare it with the checksums of the build.

        Checks each segment's metadata, the size and XXH3-128 of every data
        and index file, and that no file is missing and none was added. It
        reads the whole store once (at disk speed) and changes nothing.

        Raises
        ------
        CorruptStoreError
            Naming every damaged, missing or unexpected file (``.files``).

        Examples
        --------
        >>> tsc.open_store("covers.tsc").verify()  # doctest: +SKIP
        """
        self._check_open()
        verify_segments(self._location, self.segments).raise_if_bad()

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
            every process mapping the store; copy it before writing to it).

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
        >>> df["img_vector"] = store.series(df["img_path"])  # doctest: +SKIP
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
    ) -> npt.NDArray[Any]:
        """Return the vectors of ``paths`` as one ``(B, *item_shape)`` array, in order.

        ``store.stack(paths)`` is ``store.take(store.rows(paths), out)``.

        Examples
        --------
        >>> x = store.stack(df["img_path"])  # doctest: +SKIP
        >>> x.shape                          # doctest: +SKIP
        (1000, 3, 32, 32)
        """
        return self.take(self.rows(paths), out=out)

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Release the mappings. Views already returned stay valid."""
        if not self._closed:
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
        if self._reopen is not None:
            return self._reopen
        return (open_directory, (self._location,))


def open_directory(
    path: str | os.PathLike[str],
    *,
    supply: ShardSupply | None = None,
    reopen: tuple[Callable[..., CacheStore], tuple[Any, ...]] | None = None,
) -> CacheStore:
    """Open the store directory ``path`` (one segment) read-only.

    Parameters
    ----------
    path
        A store directory written by a build.
    supply
        Makes shard files present before they are mapped, for stores whose
        shards are fetched on demand (see
        :class:`~tensorstore_cache.reader.segment.ShardSupply`).
    reopen
        How an unpickled copy reopens the store (default: this directory).

    Raises
    ------
    StoreNotFoundError
        If there is no directory at ``path``.
    CorruptStoreError
        If its metadata is invalid.
    """
    root = Path(os.fspath(path))
    if not root.is_dir():
        raise StoreNotFoundError(
            f"no store at {str(root)!r}; build one with tensorstore_cache.build_store "
            "(or check the path)"
        )
    segment = Segment(root, supply=supply)
    return CacheStore([segment], segment.spec, str(root), reopen=reopen)
