"""The map-style :class:`StoreDataset` over a store, and its batch collation.

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
* ``ds.dataloader(256)`` (or ``ds.dataloader(sampler=StoreSampler(...))``):
  a :class:`StoreLoader` that indexes the dataset with a list of indices
  per batch and gets the batch back; it can resume (``state_dict()``) and
  augment whole batches (``batch_transform=``).

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
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data import default_collate as _default_collate

from .._api import open_store
from ..format import Ragged
from ..loaders import to_float32
from ..reader import CacheStore, view_of
from .loader import StoreLoader
from .records import RaggedMode, check_fields, record_batch, record_item, record_samples
from .sampler import StoreSampler
from .transforms import BatchTransform, accepts_generator, apply_seeded

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
    >>> from torch.utils.data import DataLoader
    >>> from tensorstore_cache.torch import StoreDataset, collate
    >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> ds = StoreDataset(store, paths, targets=np.arange(len(paths), dtype="float32"))
    >>> x, y = next(iter(DataLoader(ds, batch_size=4, collate_fn=collate)))
    >>> x.shape, y.tolist()
    (torch.Size([4, 3, 32, 32]), [0.0, 1.0, 2.0, 3.0])
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


def _served_fields(
    store: CacheStore, fields: Sequence[str] | None, *, as_float: bool,
    transform: Transform | None, ragged: RaggedMode,
) -> tuple[str, ...] | None:
    """The fields a dataset over ``store`` serves (None: one tensor per key), the options
    checked against the kind of store."""
    if store.records:
        if as_float:
            raise TypeError(
                "as_float converts one uint8 tensor; a store of records has fields of their "
                "own dtypes: convert a field in batch_transform={field: to_float32}, or "
                "serve one field: StoreDataset(store.field(name), ...)"
            )
        if transform is not None:
            raise TypeError(
                "transform= runs per item on one tensor; for records use "
                "batch_transform={field: fn} (on each gathered batch)"
            )
        if ragged not in ("pad", "packed", "nested"):
            raise ValueError(f"ragged must be 'pad', 'packed' or 'nested', got {ragged!r}")
        return check_fields(store, fields)
    if fields is not None:
        raise TypeError(f"fields= serves fields of a store of records; {store.location!r} "
                        "holds one tensor per key")
    return None


def _checked_targets(targets: npt.ArrayLike, n: int) -> npt.NDArray[Any]:
    """``targets`` as a contiguous array of one number per item, checked."""
    y = np.asarray(targets)
    if y.ndim == 0 or len(y) != n:
        raise ValueError(
            f"targets must hold one value per item: got {y.shape[0] if y.ndim else 'a scalar'} "
            f"for {n} items"
        )
    if y.dtype.kind not in "biuf":
        raise TypeError(
            f"targets must be numbers or booleans, got dtype {y.dtype}; encode labels as "
            "integers first (e.g. pandas.factorize)"
        )
    return np.ascontiguousarray(y)


@dataclass(frozen=True, slots=True)
class _BatchTransforms:
    """The batch transforms of a :meth:`StoreDataset.dataloader`, checked."""

    fn: BatchTransform | dict[str, BatchTransform]
    """One callable, or one per served field of a store of records."""
    takes_generator: bool | dict[str, bool]
    """Whether each takes a ``generator=`` (see :func:`.transforms.apply_seeded`)."""


class StoreDataset(Dataset[Any]):
    r"""A map-style dataset whose item ``i`` is the vector of ``paths[i]``.

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
    fields
        For a store of records: the fields to serve, in order (default:
        every field but text ones; a text field named here comes as ``str``,
        a ``list`` of them in a batch). Items and batches are then ``dict``\ s
        of the fields (see :mod:`tensorstore_cache.torch.records`).
    ragged
        How a batch holds a ragged field: ``"pad"`` (default: ``(B, Lmax)``
        plus ``<f>_len``; works with torch's default collate), ``"packed"``
        (values plus ``<f>_offsets``, int32) or ``"nested"`` (a
        ``torch.nested`` tensor); the last two need
        ``collate_fn=tensorstore_cache.torch.collate``.
    pad_value
        What ``"pad"`` pads with.
    max_len
        With ``"pad"``: truncate the first varying dimension to this size.

    Notes
    -----
    Single items are zero-copy tensors over the mapped files (copy-on-write:
    writing to one changes only this process's copy). Batches are new
    tensors, gathered with one :meth:`CacheStore.take`.

    Examples
    --------
    >>> from tensorstore_cache.torch import StoreDataset
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> ds = StoreDataset("covers.tsc", paths[::-1], targets=[5, 4, 3, 2, 1, 0, 1, 2])
    >>> x, y = ds[0]  # the last cover, zero-copy, and its target
    >>> x.shape, int(y), len(ds)
    (torch.Size([3, 32, 32]), 5, 8)
    >>> for xb, yb in ds.dataloader(4, shuffle=True, seed=0):  # one gather per batch
    ...     print(tuple(xb.shape), tuple(yb.shape))
    (4, 3, 32, 32) (4,)
    (4, 3, 32, 32) (4,)
    """

    def __init__(
        self,
        store_or_path: CacheStore | str | os.PathLike[str],
        paths: Iterable[str | os.PathLike[str]] | None = None,
        targets: npt.ArrayLike | None = None,
        transform: Transform | None = None,
        *,
        as_float: bool = False,
        fields: Sequence[str] | None = None,
        ragged: RaggedMode = "pad",
        pad_value: Any = 0,
        max_len: int | None = None,
    ) -> None:
        store = store_or_path if isinstance(store_or_path, CacheStore) else open_store(store_or_path)
        self.fields: tuple[str, ...] | None = None
        """The fields served, for a store of records (None: one tensor per key)."""
        if not store.records and not store.fixed:
            raise TypeError(
                f"{store.location!r} is a ragged or text field; serve it from its store of "
                "records: StoreDataset(store, fields=[name])"
            )
        self.fields = _served_fields(store, fields, as_float=as_float, transform=transform,
                                     ragged=ragged)
        self.ragged: RaggedMode = ragged
        self.pad_value = pad_value
        self.max_len = max_len
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
            self.targets = _checked_targets(targets, len(self.rows))
        self.transform = transform
        self.as_float = bool(as_float)
        if self.fields is not None:
            return
        src = np.dtype(store.spec.dtype)
        if self.as_float and src != np.uint8:
            raise ValueError(
                f"as_float=True converts uint8 stores; {store.location!r} holds {src.name} "
                "vectors already - drop as_float"
            )
        self._np_dtype = np.dtype(np.float32) if self.as_float else src
        self._torch_dtype = torch.from_numpy(np.empty(0, dtype=self._np_dtype)).dtype
        self._item_shape = tuple(store.spec.item_shape or ())

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
        if self.fields is not None:
            item = record_item(self.store, int(self.rows[i]), self.fields)
            return item if self.targets is None else (item, torch.as_tensor(self.targets[i]))
        view = view_of(self.store).vector(int(self.rows[i]))
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

    def _batch(
        self, indices: Sequence[int] | npt.NDArray[np.integer[Any]], shared: bool,
        augment: _BatchTransforms | None = None,
    ) -> Any:
        """The batch of ``indices``, gathered in shared memory if ``shared``, with the batch
        transforms of ``augment`` applied (those of a :meth:`dataloader`)."""
        idx = np.asarray(indices, dtype=np.int64)
        rows = self.rows[idx]  # IndexError for out-of-range indices
        seed = getattr(indices, "seed", None)
        if self.fields is not None:
            batch = self._records(rows, seed, shared, augment)
            return batch if self.targets is None else (batch, torch.from_numpy(self.targets[idx]))
        if augment is None:
            x = self._gather(rows, shared)
        else:
            x = self._transformed(rows, seed, shared, augment)
        if self.transform is not None:
            x = torch.stack([self.transform(item) for item in x.unbind(0)])
        if self.targets is None:
            return x
        return x, torch.from_numpy(self.targets[idx])

    def _records(
        self, rows: npt.NDArray[np.int64], seed: int | None, shared: bool,
        augment: _BatchTransforms | None,
    ) -> dict[str, Any]:
        """A batch of records: one gather per field, then each field's batch transform."""
        assert self.fields is not None
        batch = record_batch(self.store, rows, self.fields, ragged=self.ragged,
                             pad_value=self.pad_value, max_len=self.max_len, shared=shared)
        transforms = None if augment is None else augment.fn
        if isinstance(transforms, dict):
            assert augment is not None
            takes = augment.takes_generator
            assert isinstance(takes, dict)
            for name, fn in transforms.items():
                x = batch[name]
                batch[name] = fn(x) if seed is None else apply_seeded(fn, x, seed, takes[name])
        return batch

    def _transformed(
        self, rows: npt.NDArray[np.int64], seed: int | None, shared: bool,
        augment: _BatchTransforms,
    ) -> torch.Tensor:
        """Gather in the stored dtype, run the batch transform, then ``as_float``."""
        fn, takes = augment.fn, augment.takes_generator
        assert not isinstance(fn, dict) and isinstance(takes, bool)
        raw = torch.from_numpy(self.store.take(rows))
        # indices from elsewhere than a StoreSampler (no seed): torch's global RNG
        x = fn(raw) if seed is None else apply_seeded(fn, raw, seed, takes)
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != len(rows):
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(
                f"batch_transform {fn!r} must return a tensor with one row per item "
                f"({len(rows)}), got {got}"
            )
        if self.as_float:
            if x.dtype != torch.uint8:
                raise TypeError(
                    f"batch_transform {fn!r} returned {x.dtype}; as_float=True converts the "
                    "uint8 batch it returns - drop as_float or the conversion in the transform"
                )
            if not shared:  # numpy's allocation, as in _gather
                return torch.from_numpy(to_float32(x.numpy()))
            out = _empty(tuple(x.shape), torch.float32, shared=True)
            to_float32(x.numpy(), out=out.numpy())
            return out
        if shared:  # in a worker: straight into the shared memory that carries it
            out = _empty(tuple(x.shape), x.dtype, shared=True)
            out.copy_(x)
            return out
        return x

    def dataloader(
        self,
        batch_size: int | None = None,
        *,
        sampler: StoreSampler | None = None,
        batch_transform: BatchTransform | dict[str, BatchTransform] | None = None,
        shuffle: bool | None = None,
        drop_last: bool | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> StoreLoader:
        """Return a resumable ``DataLoader`` that gathers each batch in one piece.

        The loader draws whole batches of indices from a :class:`StoreSampler`
        and calls :meth:`batch` once per batch: no per-item work, no stacking,
        and in worker processes the batch is written straight into shared
        memory. It keeps its position (``state_dict()`` /
        ``load_state_dict()``, ``loader.epoch``); see :class:`StoreLoader`.

        Parameters
        ----------
        batch_size
            Items per batch, for a loader without ``sampler``.
        sampler
            A :class:`StoreSampler` over this dataset (``len(self)`` items):
            the order, the global batch and this process's rank. Then
            ``batch_size``, ``shuffle``, ``drop_last``, ``seed`` and
            ``generator`` come from it and may not be passed.
        batch_transform
            A callable run once per gathered batch (in the worker, or in this
            process with ``num_workers=0``) on the batch tensor in the stored
            dtype, before ``as_float``; targets pass through. Called as
            ``f(x, generator=g)`` if it takes a ``generator``, else ``f(x)``
            inside ``torch.random.fork_rng()``; either way seeded from
            ``(seed, epoch, step)`` and the batch's place in its global
            batch, so a resumed run augments the same way, whatever the
            number of workers. See :mod:`tensorstore_cache.torch.transforms`.
        shuffle
            Without ``sampler``: a new order each epoch (default ``False``).
        drop_last
            Without ``sampler``: drop the last, smaller batch of each epoch
            (default ``False``).
        seed
            Without ``sampler``: seed of the order and of ``batch_transform``
            (default 0).
        generator
            Without ``sampler``, instead of ``seed``: a ``torch.Generator``
            that draws the seed.
        **kwargs
            Passed on to ``torch.utils.data.DataLoader`` (``num_workers``,
            ``multiprocessing_context``, ``pin_memory``, ``persistent_workers``,
            ...); not ``batch_sampler``, ``collate_fn`` or ``in_order=False``.

        Returns
        -------
        StoreLoader
            The loader (a ``torch.utils.data.DataLoader``).

        Raises
        ------
        TypeError
            For options that conflict with ``sampler`` or that the loader
            chooses itself.
        ValueError
            If ``sampler`` is over another number of items.

        Examples
        --------
        >>> from tensorstore_cache.torch import RandomFlipCrop, StoreDataset, StoreSampler
        >>> store = tsc.build_store(paths, "covers.tsc", dtype="uint8", progress=False)
        >>> ds = StoreDataset(store, paths, targets=np.ones(len(paths)), as_float=True)
        >>> [tuple(x.shape) for x, y in ds.dataloader(3, shuffle=True)]
        [(3, 3, 32, 32), (3, 3, 32, 32), (2, 3, 32, 32)]
        >>> sampler = StoreSampler(len(ds), global_batch_size=4, seed=0)
        >>> loader = ds.dataloader(sampler=sampler, batch_transform=RandomFlipCrop(pad=4))
        >>> x, y = next(iter(loader))  # flipped and cropped, then as float32
        >>> x.dtype, float(x.max()) <= 1.0
        (torch.float32, True)
        """
        for name in ("batch_sampler", "collate_fn"):
            if name in kwargs:
                raise TypeError(f"dataloader() chooses {name} itself; do not pass {name}=")
        sampler = self._sampler(sampler, batch_size, shuffle, drop_last, seed, generator)
        dataset: Dataset[Any] = self
        if batch_transform is not None:  # the dataset itself is left as it is
            dataset = _Augmented(self, self._checked_batch_transform(batch_transform))
        return StoreLoader(dataset, sampler, keys=self._keys, **kwargs)

    def _sampler(
        self, sampler: StoreSampler | None, batch_size: int | None, shuffle: bool | None,
        drop_last: bool | None, seed: int | None, generator: torch.Generator | None,
    ) -> StoreSampler:
        """The sampler of :meth:`dataloader`: the one given, checked, or one made of its
        arguments."""
        if sampler is not None:
            given = [name for name, v in (("batch_size", batch_size), ("shuffle", shuffle),
                                          ("drop_last", drop_last), ("seed", seed),
                                          ("generator", generator)) if v is not None]
            if given:
                raise TypeError(
                    f"dataloader(sampler=...) takes {', '.join(given)} from the sampler; pass "
                    f"{' and '.join(given)} to StoreSampler(...) instead"
                )
            if not isinstance(sampler, StoreSampler):
                raise TypeError(
                    f"sampler= takes a StoreSampler, got {type(sampler).__name__}; for another "
                    "sampler use DataLoader(ds, batch_sampler=...) (ds gathers each batch at once)"
                )
            if sampler.n != len(self):
                raise ValueError(
                    f"the sampler is over {sampler.n} items, this dataset has {len(self)}; "
                    f"pass StoreSampler(len(ds), ...)"
                )
        else:
            if batch_size is None:
                raise TypeError("dataloader() needs batch_size, or sampler=StoreSampler(...)")
            if seed is not None and generator is not None:
                raise TypeError("pass seed= or generator=, not both")
            if generator is not None:  # the generator draws the seed
                seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
            sampler = StoreSampler(
                len(self), global_batch_size=batch_size, seed=0 if seed is None else seed,
                shuffle=bool(shuffle), drop_last=bool(drop_last), rank=0, world_size=1,
            )
        return sampler

    def _checked_batch_transform(
        self, batch_transform: BatchTransform | dict[str, BatchTransform],
    ) -> _BatchTransforms:
        """``batch_transform`` checked against the served fields, and whether each takes a
        generator."""
        if isinstance(batch_transform, dict):
            if self.fields is None:
                raise TypeError("batch_transform={field: fn} is for a store of records; "
                                "pass one callable")
            for name, fn in batch_transform.items():
                if name not in self.fields or not callable(fn):
                    raise TypeError(f"batch_transform[{name!r}] must be a callable of a "
                                    f"served field ({list(self.fields)})")
            return _BatchTransforms(dict(batch_transform), {
                name: accepts_generator(fn) for name, fn in batch_transform.items()})
        else:
            if not callable(batch_transform):
                raise TypeError(f"batch_transform must be callable, got {batch_transform!r}")
            if self.fields is not None:
                raise TypeError("a store of records takes batch_transform={field: fn}")
            return _BatchTransforms(batch_transform, accepts_generator(batch_transform))

    def _keys(self) -> list[str]:
        """The key of every item, in order (what the loader's digest covers)."""
        paths = self.store.paths
        return [paths[r] for r in self.rows.tolist()]

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
        if self.fields is not None:
            x = collated if self.targets is None else collated[0]
            ragged = [n for n, f in self.store.spec.schema
                      if n in self.fields and isinstance(f, Ragged)]
            samples = record_samples(x, len(indices), self.ragged, ragged)
            if self.targets is None:
                return _Batch(samples, collated)
            return _Batch(zip(samples, collated[1].unbind(0), strict=True), collated)
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


class _Augmented(Dataset[Any]):
    """What the loader of ``dataloader(batch_transform=...)`` reads: the dataset's items,
    and its batches with the batch transforms applied (picklable, as the dataset is)."""

    def __init__(self, dataset: StoreDataset, augment: _BatchTransforms) -> None:
        self.dataset = dataset
        self.augment = augment

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int | slice | Sequence[int] | npt.NDArray[np.integer[Any]]) -> Any:
        if isinstance(index, (int, np.integer)):
            return self.dataset[int(index)]
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        return self.dataset._batch(index, shared=get_worker_info() is not None,
                                   augment=self.augment)
