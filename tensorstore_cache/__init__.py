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

from ._api import build_store, cached, open_store, verify_store
from .cache.gc import CacheInfo, Removed, gc, list_caches
from .config import __version__
from .errors import (
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
from .format.spec import FORMAT_VERSION, StoreSpec
from .format.verify import VerifyReport
from .loaders import ImageLoader, to_float32
from .reader.store import CacheStore

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
