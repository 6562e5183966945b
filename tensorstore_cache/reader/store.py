"""The public handle: :class:`CacheStore` and :func:`open_store`."""

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

from ..errors import KeyNotInStoreError, StoreNotFoundError
from ..format.keys import encode_key, hash_encoded, normalize_key, normalize_keys
from ..format.spec import StoreSpec
from .overlay import Overlay
from .segment import Segment

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CacheStore", "open_store"]

_T = TypeVar("_T")
#: Keys looked up per vectorised step of :meth:`CacheStore.rows`.
_ROWS_CHUNK = 4096
_MISSING: Any = object()


class CacheStore:
    """A read-only, memory-mapped store of fixed-shape vectors keyed by path.

    Obtain one with :func:`open_store`, :func:`build_store` or
    :func:`cached`. It behaves like a read-only mapping from path to vector:
    ``store[path]`` raises :class:`KeyNotInStoreError` on a miss, ``.get``
    does not, ``path in store`` and ``len(store)`` work, and it is a context
    manager. Vectors are views of the mapped files (copy-on-write: writing to
    one changes only this process's copy, never the file).

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
        self._segments = list(segments)
        self._spec = spec
        self._location = location
        self._closed = False
        self._single = self._segments[0] if len(self._segments) == 1 else None
        # several segments: later ones override earlier ones; rows number the live entries
        self._overlay = None if self._single is not None else Overlay(self._segments)
        self._dtype = np.dtype(spec.dtype)
        self._paths: list[str] | None = None
        self._reopen = reopen
        self._resources = list(resources)  # closed with the store (e.g. readers' locks)

    # -- description ----------------------------------------------------------

    @property
    def spec(self) -> StoreSpec:
        """The store's :class:`StoreSpec` (``n`` counts distinct keys)."""
        if self._overlay is not None and self._spec.n != self._overlay.n:
            self._spec = dataclasses.replace(self._spec, n=self._overlay.n)
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
            single = self._single
            self._paths = single.key_list() if single is not None else self._overlay_().paths()
        return self._paths

    def __len__(self) -> int:
        single = self._single
        return single.n if single is not None else self._overlay_().n

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} x {self._spec.item_shape} {self._spec.dtype}"
        return f"<CacheStore {self._location!r}: {state}>"

    # -- lookups --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self._location!r} is closed")

    def _overlay_(self) -> Overlay:
        assert self._overlay is not None
        return self._overlay

    def _locate(self, key: str) -> tuple[int, int]:
        """Return ``(segment index, local row)`` of ``key``, ``(-1, -1)`` if absent."""
        enc = encode_key(key)
        h = xxhash.xxh3_64_intdigest(enc)
        for k in range(len(self._segments) - 1, -1, -1):  # the newest segment wins
            row = self._segments[k].find(enc, h)
            if row >= 0:
                return k, row
        return -1, -1

    def _find(self, key: str) -> int:
        single = self._single
        if single is not None:
            enc = encode_key(key)
            return single.find(enc, xxhash.xxh3_64_intdigest(enc))
        k, row = self._locate(key)
        return -1 if k < 0 else self._overlay_().one_to_global(k, row)

    def _vector(self, row: int) -> npt.NDArray[Any]:
        single = self._single
        if single is not None:
            return single.row(row)
        k, local = self._overlay_().locate_one(row)
        return self._segments[k].row(local)

    def _lookup(self, key: str) -> npt.NDArray[Any] | None:
        single = self._single
        if single is not None:
            enc = encode_key(key)
            row = single.find(enc, xxhash.xxh3_64_intdigest(enc))
            return None if row < 0 else single.row(row)
        k, row = self._locate(key)
        return None if k < 0 else self._segments[k].row(row)

    def __getitem__(self, path: str | os.PathLike[str]) -> npt.NDArray[Any]:
        """Return the vector of ``path`` as a copy-on-write view."""
        if self._closed:
            self._check_open()
        key = normalize_key(path)
        single = self._single
        if single is not None:  # the hot path, inlined
            enc = key.encode("utf-8", "surrogateescape")
            row = single.find(enc, xxhash.xxh3_64_intdigest(enc))
            if row >= 0:
                return single.row(row)
            raise KeyNotInStoreError([key])
        vector = self._lookup(key)
        if vector is None:
            raise KeyNotInStoreError([key])
        return vector

    @overload
    def get(self, path: str | os.PathLike[str]) -> npt.NDArray[Any] | None: ...
    @overload
    def get(self, path: str | os.PathLike[str], default: _T) -> npt.NDArray[Any] | _T: ...
    def get(self, path: str | os.PathLike[str], default: Any = None) -> Any:
        """Return the vector of ``path``, or ``default`` when it is not stored."""
        self._check_open()
        vector = self._lookup(normalize_key(path))
        return default if vector is None else vector

    def __contains__(self, path: object) -> bool:
        self._check_open()
        try:
            key = normalize_key(path)
        except (TypeError, ValueError):
            return False
        return self._find(key) >= 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def rows(self, paths: Iterable[str | os.PathLike[str]], *, missing: str = "raise") -> npt.NDArray[np.int64]:
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
        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore', got {missing!r}")
        values = getattr(paths, "values", paths)  # a pandas Series -> its ndarray
        if isinstance(values, (str, bytes, os.PathLike)):
            raise TypeError(
                f"paths must be an iterable of paths, not a single path: {values!r}; "
                "wrap it in a list"
            )
        if not isinstance(values, (list, tuple, np.ndarray)):
            values = list(values)
        out = np.full(len(values), -1, dtype=np.int64)
        missing_keys: list[str] = []
        # In chunks: the temporaries of a lookup grow with the keys' bytes, and a
        # process keeps freed heap, so one huge call would cost memory for good.
        for start in range(0, len(values), _ROWS_CHUNK):
            keys = normalize_keys(values[start : start + _ROWS_CHUNK])
            found = self._rows_of(keys)
            out[start : start + len(keys)] = found
            if missing == "raise" and np.any(found < 0):
                missing_keys.extend(keys[i] for i in np.flatnonzero(found < 0).tolist())
        if missing_keys:
            raise KeyNotInStoreError(missing_keys)
        return out

    def _rows_of(self, keys: list[str]) -> npt.NDArray[np.int64]:
        """Return the row of every normalised key, -1 where absent."""
        encoded = [encode_key(k) for k in keys]
        hashes = hash_encoded(encoded)
        out = np.full(len(keys), -1, dtype=np.int64)
        for k in range(len(self._segments) - 1, -1, -1):  # the newest segment wins
            seg = self._segments[k]
            todo = np.flatnonzero(out < 0)
            if len(todo) == 0:
                break
            if len(todo) == len(out):
                found = seg.find_many(encoded, hashes)
            else:
                found = seg.find_many([encoded[i] for i in todo.tolist()], hashes[todo])
            hit = found >= 0
            local = found[hit]
            out[todo[hit]] = local if self._single is not None else self._overlay_().to_global(k, local)
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
        single = self._single
        if single is not None:
            single.gather(idx, out)
            return out
        seg_of, local = self._overlay_().locate(idx)
        for k in np.unique(seg_of).tolist():
            sel = np.flatnonzero(seg_of == k)
            part = np.empty((len(sel), *self._spec.item_shape), dtype=self._dtype)
            self._segments[k].gather(local[sel], part)
            out[sel] = part
        return out

    def stale(self, paths: Iterable[str | os.PathLike[str]] | None = None, *, check: str = "stat") -> list[str]:
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
        from .sources import stale_keys

        self._check_open()
        keys = self.paths if paths is None else list(dict.fromkeys(normalize_keys(paths)))
        return stale_keys(self, keys, check=check)

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
        from ..format.verify import verify_store

        self._check_open()
        verify_store(self).raise_if_bad()

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

        Examples
        --------
        >>> df["img_vector"] = store.series(df["img_path"])  # doctest: +SKIP
        """
        from .series import series

        return series(self, paths, name=name)

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
            for seg in self._segments:
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
        return (open_store, (self._location,))


def open_store(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CacheStore:
    """Open a store read-only, mapping its files (no data is read or copied).

    Parameters
    ----------
    path
        The store directory written by :func:`build_store`, or an fsspec URL
        of one (``s3://bucket/covers.tsc``, ``gs://...``; needs the
        ``remote`` extra). A remote store is copied once per node into
        ``<cache_dir>/remote/`` (downloaded, every file checked against its
        recorded checksum, published atomically; processes of the node that
        ask at the same time wait for one copy) and mapped from there; a
        changed remote store gets a new copy. ``file://`` URLs are local.
    cache_dir
        For URLs: where the node-local copy goes (default ``$TSC_CACHE_DIR``,
        else ``~/.cache/tensorstore_cache``).
    storage_options
        For URLs: options of the fsspec filesystem (credentials,
        ``endpoint_url``, ...).

    Returns
    -------
    CacheStore
        The open store.

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``path``.
    CorruptStoreError
        If its metadata is invalid or its index files are damaged.

    Examples
    --------
    >>> store = open_store("covers.tsc")  # doctest: +SKIP
    >>> store.spec.item_shape             # doctest: +SKIP
    (3, 32, 32)
    """
    if isinstance(path, str) and "://" in path:
        from ..remote.fetch import is_url, open_remote

        if is_url(path):
            return open_remote(path, cache_dir=cache_dir, storage_options=storage_options)
    root = Path(os.fspath(path))
    if not root.is_dir():
        raise StoreNotFoundError(
            f"no store at {str(root)!r}; build one with tensorstore_cache.build_store "
            "(or check the path)"
        )
    from ..cache.namespace import is_namespace, open_namespace

    if is_namespace(root):  # a directory of tensorstore_cache.cached(): all its live parts
        return open_namespace(root)
    segment = Segment(root)
    return CacheStore([segment], segment.spec, str(root))
