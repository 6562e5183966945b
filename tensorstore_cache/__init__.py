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
from ._cache import cached
from ._errors import (
    BuildError,
    CorruptStoreError,
    KeyNotInStoreError,
    ReentrantBuildError,
    StaleSourceError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    TensorStoreCacheError,
)
from ._gc import CacheInfo, Removed, gc, list_caches
from ._loader import ImageLoader, to_float32
from ._spec import FORMAT_VERSION, StoreSpec
from ._store import CacheStore, open_store
from ._verify import VerifyReport, verify_store

__version__ = "0.1.0"

__all__ = [
    "BuildError",
    "CacheInfo",
    "CacheStore",
    "CorruptStoreError",
    "FORMAT_VERSION",
    "ImageLoader",
    "KeyNotInStoreError",
    "ReentrantBuildError",
    "Removed",
    "StaleSourceError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreSpec",
    "TensorStoreCacheError",
    "VerifyReport",
    "__version__",
    "build_store",
    "cached",
    "gc",
    "list_caches",
    "open_store",
    "to_float32",
    "verify_store",
]
