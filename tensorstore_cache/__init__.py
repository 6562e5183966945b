"""tensorstore_cache: preprocess once, map everywhere.

Vectors (e.g. images decoded and resized to ``3 x 32 x 32``) are written once
into a zarr v3 store keyed by source path; every process opens it read-only
and zero-copy through the OS page cache.

Examples
--------
>>> import tensorstore_cache as tsc
>>> store = tsc.build_store(paths, "covers.tsc", size=(32, 32), progress=False)
>>> store = tsc.open_store("covers.tsc")  # in any process
>>> batch = store.take(store.rows(paths))
>>> batch.shape
(8, 3, 32, 32)
"""

from ._api import build_store, cached, open_store, verify_store
from .cache import CacheInfo, RemoteCacheInfo, Removed, gc, list_caches
from .config import __version__
from .errors import (
    BuildError,
    CacheLimitWarning,
    CorruptStoreError,
    KeyNotInStoreError,
    LoaderFingerprintWarning,
    ReentrantBuildError,
    StaleSourceError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    StorePermissionWarning,
    StoreReplacedError,
    TensorStoreCacheError,
    UnnamedLoaderError,
    UnsafeRemoteError,
    UntrustedCacheError,
)
from .format import FORMAT_VERSION, Fixed, Ragged, StoreSpec, Text, VerifyReport
from .identity import LoaderFingerprint, loader_fingerprint
from .loaders import BatchLoader, ImageLoader, to_float32
from .reader import CacheStore, Record

__all__ = [
    "BatchLoader",
    "BuildError",
    "CacheInfo",
    "CacheLimitWarning",
    "CacheStore",
    "CorruptStoreError",
    "FORMAT_VERSION",
    "Fixed",
    "ImageLoader",
    "KeyNotInStoreError",
    "LoaderFingerprint",
    "LoaderFingerprintWarning",
    "Ragged",
    "Record",
    "ReentrantBuildError",
    "RemoteCacheInfo",
    "Removed",
    "StaleSourceError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StorePermissionWarning",
    "StoreReplacedError",
    "StoreSpec",
    "TensorStoreCacheError",
    "Text",
    "UnnamedLoaderError",
    "UnsafeRemoteError",
    "UntrustedCacheError",
    "VerifyReport",
    "__version__",
    "build_store",
    "cached",
    "gc",
    "list_caches",
    "loader_fingerprint",
    "open_store",
    "to_float32",
    "verify_store",
]
