"""Several machines: stores at URLs and in object storage, node caches, the shard-supply
protocol, Dask clusters, network mounts."""
