"""PyTorch integration: datasets, a resumable rank-aware sampler, batch augmentation.

This subpackage is the only part of tensorstore_cache that imports torch.

* :class:`StoreDataset`: a map-style dataset over a store; items are
  zero-copy views, batches are gathered with one read
  (:mod:`~tensorstore_cache.torch.dataset`).
* :class:`StoreSampler`: the order of training reads, the same on every
  machine and for every world size that divides the global batch
  (:mod:`~tensorstore_cache.torch.sampler`).
* :class:`StoreLoader`: what ``ds.dataloader(...)`` returns, a ``DataLoader``
  whose ``state_dict()`` resumes mid-epoch at any valid world size
  (:mod:`~tensorstore_cache.torch.loader`, :mod:`~tensorstore_cache.torch.state`).
* Batch transforms (:class:`RandomFlipCrop`, :class:`ColorJitter`, ...): random
  augmentation of whole ``uint8`` batches, per sample, seeded per step
  (:mod:`~tensorstore_cache.torch.transforms`).

Examples
--------
>>> import tensorstore_cache.torch as tsc_torch
>>> store = tsc.build_store(paths, "covers.tsc", dtype="uint8", progress=False)
>>> ds = tsc_torch.StoreDataset(store, paths, np.arange(len(paths)), as_float=True)
>>> sampler = tsc_torch.StoreSampler(len(ds), global_batch_size=4, seed=0)
>>> loader = ds.dataloader(sampler=sampler, batch_transform=tsc_torch.RandomFlipCrop(pad=4))
>>> ckpt, epochs = {}, 2
>>> for epoch in range(loader.epoch, epochs):
...     for xb, yb in loader:
...         ckpt["data"] = loader.state_dict()
>>> ckpt["data"]["epoch"], tuple(xb.shape)
(2, (4, 3, 32, 32))
"""

from __future__ import annotations

from .dataset import StoreDataset, collate
from .loader import StoreLoader
from .sampler import StoreSampler
from .transforms import (
    ColorJitter,
    Compose,
    RandomCrop,
    RandomFlipCrop,
    RandomHorizontalFlip,
    to_float32,
)

__all__ = [
    "ColorJitter",
    "Compose",
    "RandomCrop",
    "RandomFlipCrop",
    "RandomHorizontalFlip",
    "StoreDataset",
    "StoreLoader",
    "StoreSampler",
    "collate",
    "to_float32",
]
