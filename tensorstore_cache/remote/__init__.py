"""Remote transport and the node cache: stores at fsspec URLs (and on network filesystems).

Nothing here opens or builds a store: :func:`~tensorstore_cache.remote.fetch.fetch_store`
puts a version's metadata and index into the node cache,
:class:`~tensorstore_cache.remote.shards.NodeShards` fetches its shards on demand
under the cap of :mod:`~tensorstore_cache.remote.budget`, and
:mod:`~tensorstore_cache.remote.upload` sends a store (shard by shard from a build's
tasks, the group ``zarr.json`` last). Opening and building are routed in
:mod:`tensorstore_cache._api` and :mod:`tensorstore_cache.writer.build`.
"""
