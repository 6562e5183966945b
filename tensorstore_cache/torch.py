"""PyTorch integration: a map-style :class:`StoreDataset` over a store.

This is the only module of tensorstore_cache that imports torch.

A :class:`StoreDataset` holds a store *location*, one ``int64`` array of
rows and, optionally, one array of targets: no Python list of arrays, so
DataLoader workers started by ``fork`` do not copy it page by page as
reference counts change (pytorch/pytorch#13246), and pickling it for
``spawn``/``forkserver`` workers sends a path and two arrays, never vector
data. Each worker reopens the store on first use and maps the same files:
every worker reads the one copy held in the OS page cache.

Three ways to batch, fastest last (figures in the README):

* ``DataLoader(ds, batch_size=256)``: the loader calls
  :meth:`StoreDataset.__getitems__`, which gathers the batch with one
  :meth:`CacheStore.take`; torch's default collate then stacks the samples.
* ``DataLoader(ds, batch_size=256, collate_fn=tensorstore_cache.torch.collate)``:
  the gathered batch is returned as it is, without stacking it again.
* ``DataLoader(ds, batch_size=None, sampler=BatchSampler(...))``: the
  dataset is indexed with a list of indices and returns the batch.

In a worker process batches are gathered straight into shared memory, so
sending them to the main process copies nothing more.

Examples
--------
>>> from torch.utils.data import DataLoader                       # doctest: +SKIP
>>> from tensorstore_cache.torch import StoreDataset, collate     # doctest: +SKIP
>>> ds = StoreDataset("covers.tsc", df["img_path"], df["rating"])  # doctest: +SKIP
>>> loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=2,
...                     collate_fn=collate)                       # doctest: +SKIP
>>> for x, y in loader:                                           # doctest: +SKIP
...     ...  # x: (256, 3, 32, 32) float32, y: (256,)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)
from torch.utils.data._utils.collate import default_collate as _default_collate

from ._api import open_store
from .loaders import to_float32
from .reader.store import CacheStore

__all__ = ["StoreDataset", "collate"]

Transform = Callable[[torch.Tensor], Any]
_Reopen = tuple[Callable[..., CacheStore], tuple[Any, ...]]
default_collate = cast(Callable[[Sequence[Any]], Any], _default_collate)


class _Batch(list[Any]):
    """The samples of one batch (what torch's default collate expects).

    Also carries the batch already gathered, which :func:`collate` returns
    without stacking the samples again.
    """

    __slots__ = ("collated",)

    def __init__(self, samples: Iterable[Any], collated: Any) -> None:
        super().__init__(samples)
        self.collated = collated


def collate(batch: Sequence[Any]) -> Any:
    """Collate function for a ``DataLoader`` over a :class:`StoreDataset`.

    Returns the batch that :meth:`StoreDataset.__getitems__` gathered in one
    piece (a ``(B, C, H, W)`` tensor, or ``(x, y)``) instead of stacking its
    samples again; anything else goes to torch's ``default_collate``.

    Parameters
    ----------
    batch
        What the dataset returned for one batch of indices.

    Returns
    -------
    Any
        The batch tensor, or ``(x, y)`` when the dataset has targets.

    Examples
    --------
    >>> loader = DataLoader(ds, batch_size=256, collate_fn=collate)  # doctest: +SKIP
    """
    if isinstance(batch, _Batch):
        return batch.collated
    return default_collate(batch)


def _empty(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised CPU tensor, in shared memory when ``shared`` (as default collate does)."""
    numel = int(np.prod(shape, dtype=np.int64))
    if not shared or numel == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


class StoreDataset(Dataset[Any]):
    """A map-style dataset whose item ``i`` is the vector of ``paths[i]``.

    Parameters
    ----------
    store_or_path
        An open :class:`CacheStore`, or the location of one.
    paths
        The paths to serve, in order, duplicates allowed (a list, a pandas
        Series, ...). Default: every entry of the store, in row order.
        Resolved to rows once, here; a path not in the store raises
        :class:`KeyNotInStoreError` naming all of them.
    targets
        Optional numeric labels, one per path (array-like, e.g.
        ``df["rating"]``). Items are then ``(x, y)``.
    transform
        Optional callable applied to each item's tensor (per item, after
        gathering).
    as_float
        For ``uint8`` stores: convert to ``float32`` in ``[0, 1]`` at gather
        time, exactly like ``ToTensor()`` (see :func:`to_float32`).

    Notes
    -----
    Single items are zero-copy tensors over the mapped files (copy-on-write:
    writing to one changes only this process's copy). Batches are new
    tensors, gathered with one :meth:`CacheStore.take`.

    Examples
    --------
    >>> ds = StoreDataset("covers.tsc", df["img_path"], targets=df["rating"])  # doctest: +SKIP
    >>> x, y = ds[0]                                                           # doctest: +SKIP
    >>> x.shape                                                                # doctest: +SKIP
    torch.Size([3, 32, 32])
    """

    def __init__(
        self,
        store_or_path: CacheStore | str | os.PathLike[str],
        paths: Iterable[str | os.PathLike[str]] | None = None,
        targets: npt.ArrayLike | None = None,
        transform: Transform | None = None,
        *,
        as_float: bool = False,
    ) -> None:
        store = store_or_path if isinstance(store_or_path, CacheStore) else open_store(store_or_path)
        self._store: CacheStore | None = store
        self._pid = os.getpid()
        self._location = store.location
        self._reopen: _Reopen = store.__reduce__()  # how a worker maps the same files
        self.rows: npt.NDArray[np.int64] = (
            np.arange(len(store), dtype=np.int64) if paths is None else store.rows(paths)
        )
        """Row of every item in the store (``int64``)."""
        self.targets: npt.NDArray[Any] | None = None
        """Target of every item, or ``None``."""
        if targets is not None:
            y = np.asarray(targets)
            if y.ndim == 0 or len(y) != len(self.rows):
                raise ValueError(
                    f"targets must hold one value per item: got {y.shape[0] if y.ndim else 'a scalar'} "
                    f"for {len(self.rows)} items"
                )
            if y.dtype.kind not in "biuf":
                raise TypeError(
                    f"targets must be numbers or booleans, got dtype {y.dtype}; encode labels as "
                    "integers first (e.g. pandas.factorize)"
                )
            self.targets = np.ascontiguousarray(y)
        self.transform = transform
        self.as_float = bool(as_float)
        src = np.dtype(store.spec.dtype)
        if self.as_float and src != np.uint8:
            raise ValueError(
                f"as_float=True converts uint8 stores; {store.location!r} holds {src.name} "
                "vectors already - drop as_float"
            )
        self._np_dtype = np.dtype(np.float32) if self.as_float else src
        self._torch_dtype = torch.from_numpy(np.empty(0, dtype=self._np_dtype)).dtype
        self._item_shape = tuple(store.spec.item_shape)

    # -- the store, reopened once per process -----------------------------------

    @property
    def store(self) -> CacheStore:
        """The open store (reopened on first use in a new process)."""
        store = self._store
        if store is None or self._pid != os.getpid():
            func, args = self._reopen
            store = self._store = func(*args)
            self._pid = os.getpid()
        return store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # a location travels, never the mapped data
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- the dataset protocol ---------------------------------------------------

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        extra = ", targets" if self.targets is not None else ""
        return f"<StoreDataset of {len(self)} items from {self._location!r}{extra}>"

    def __getitem__(self, index: int | slice | Sequence[int] | npt.NDArray[np.integer[Any]]) -> Any:
        """Return item ``index``: a tensor, or ``(x, y)`` with targets.

        An integer gives one zero-copy item. A slice, a list or an array of
        indices gives the whole batch, gathered at once (for a ``DataLoader``
        with ``batch_size=None`` and a ``BatchSampler`` as its sampler).
        """
        if isinstance(index, (int, np.integer)):
            return self._item(int(index))
        return self.batch(np.arange(len(self))[index] if isinstance(index, slice) else index)

    def _item(self, i: int) -> Any:
        n = len(self.rows)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for a dataset of {n} items")
        view = self.store.vector(int(self.rows[i]))
        x = torch.from_numpy(to_float32(view) if self.as_float else view)
        if self.transform is not None:
            x = self.transform(x)
        if self.targets is None:
            return x
        return x, torch.as_tensor(self.targets[i])

    def batch(self, indices: Sequence[int] | npt.NDArray[np.integer[Any]]) -> Any:
        """Gather the items ``indices`` as one batch with one :meth:`CacheStore.take`.

        Parameters
        ----------
        indices
            Item indices (not store rows), any order, repeats allowed.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            ``(B, *item_shape)``, or ``(x, y)`` with targets. Inside a
            DataLoader worker the tensor lives in shared memory. With a
            ``transform``, the items are transformed one by one and stacked.
        """
        return self._batch(indices, shared=get_worker_info() is not None)

    def _batch(self, indices: Sequence[int] | npt.NDArray[np.integer[Any]], shared: bool) -> Any:
        idx = np.asarray(indices, dtype=np.int64)
        rows = self.rows[idx]  # IndexError for out-of-range indices
        x = self._gather(rows, shared)
        if self.transform is not None:
            x = torch.stack([self.transform(item) for item in x.unbind(0)])
        if self.targets is None:
            return x
        return x, torch.from_numpy(self.targets[idx])

    def dataloader(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> DataLoader[Any]:
        """Return a ``DataLoader`` that gathers each batch in one piece.

        The loader samples whole batches of indices (a ``BatchSampler``) and
        calls :meth:`batch` once per batch: no per-item work, no stacking, and
        in worker processes the batch is written straight into shared memory.

        Parameters
        ----------
        batch_size
            Items per batch.
        shuffle
            Draw items in a random order each epoch.
        drop_last
            Drop the last, smaller batch.
        generator
            Random generator for the shuffle.
        **kwargs
            Passed on to ``torch.utils.data.DataLoader`` (``num_workers``,
            ``multiprocessing_context``, ``pin_memory``, ``persistent_workers``,
            ...); not ``batch_size``, ``sampler``, ``batch_sampler`` or ``collate_fn``.

        Examples
        --------
        >>> for x, y in ds.dataloader(256, shuffle=True, num_workers=2):  # doctest: +SKIP
        ...     loss = model(x, y)
        """
        for name in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn"):
            if name in kwargs:
                raise TypeError(f"dataloader() chooses {name} itself; do not pass {name}=")
        order: Sampler[int] = (
            RandomSampler(self, generator=generator) if shuffle else SequentialSampler(self)
        )
        sampler = BatchSampler(order, batch_size=batch_size, drop_last=drop_last)
        return DataLoader(self, batch_size=None, sampler=sampler, **kwargs)

    def __getitems__(self, indices: Sequence[int]) -> _Batch:
        """Return the samples of a batch, gathered at once (used by ``DataLoader``).

        The result is a list of samples, as torch's default collate expects;
        :func:`collate` returns the batch gathered here without stacking again.
        """
        # Gathered in private memory: in a worker, torch's default collate stacks
        # the samples into shared memory itself (and a batch returned by `collate`
        # is moved there when the worker sends it); gathering into shared memory
        # here would pay for fresh shared pages twice with the default collate.
        collated = self._batch(indices, shared=False)
        if self.targets is None:
            return _Batch(collated.unbind(0), collated)
        x, y = collated
        return _Batch(zip(x.unbind(0), y.unbind(0), strict=True), collated)

    def _gather(self, rows: npt.NDArray[np.int64], shared: bool) -> torch.Tensor:
        store = self.store
        if shared:
            out = _empty((len(rows), *self._item_shape), self._torch_dtype, shared=True)
            if self.as_float:
                to_float32(store.take(rows), out=out.numpy())
            else:
                store.take(rows, out=out.numpy())
            return out
        # numpy's allocation, not torch.empty: in DataLoader workers, batches in
        # torch-allocated private buffers that are then moved to shared memory
        # leave glibc's heap growing by every batch (about the size of each epoch).
        data = store.take(rows)
        return torch.from_numpy(to_float32(data) if self.as_float else data)
