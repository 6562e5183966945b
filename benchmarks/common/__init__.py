"""What several benchmarks share: the caching methods (:mod:`.methods`), reports and
results files, portable paths, memory sampling, failure records, the cover images and
the S3 server."""
