"""tensorstore_cache: preprocess once, map everywhere.

Vectors (e.g. images decoded and resized to ``3 x 32 x 32``) are written once
into a zarr v3 store keyed by source path; every process opens it read-only
and zero-copy through the OS page cache.

Examples
--------
>>> import tensorstore_cache as tsc
>>> store = tsc.build_store(paths, "covers.tsc", size=(32, 32))  # doctest: +SKIP
>>> store = tsc.open_store("covers.tsc")                         # doctest: +SKIP
>>> batch = store.take(store.rows(paths))                        # doctest: +SKIP
"""

from ._build import build_store
from ._errors import (
    BuildError,
    CorruptStoreError,
    KeyNotInStoreError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    TensorStoreCacheError,
)
from ._loader import ImageLoader, to_float32
from ._spec import FORMAT_VERSION, StoreSpec
from ._store import CacheStore, open_store

__version__ = "0.1.0"

__all__ = [
    "BuildError",
    "CacheStore",
    "CorruptStoreError",
    "FORMAT_VERSION",
    "ImageLoader",
    "KeyNotInStoreError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreSpec",
    "TensorStoreCacheError",
    "__version__",
    "build_store",
    "open_store",
    "to_float32",
]
