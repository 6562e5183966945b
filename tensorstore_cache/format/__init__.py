"""The on-disk format: what every byte of a store means, read and written through :mod:`~tensorstore_cache.fs`."""
