"""Remote transport: copy a store between an fsspec URL and a node-local directory.

Nothing here opens or builds a store: :func:`~tensorstore_cache.remote.fetch.fetch_store`
returns a verified local directory, :func:`~tensorstore_cache.remote.upload.upload_store`
sends one. Opening and building are routed in :mod:`tensorstore_cache._api`.
"""
