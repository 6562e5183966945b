"""Benchmarks of tensorstore_cache against the ways users cache preprocessed vectors."""
