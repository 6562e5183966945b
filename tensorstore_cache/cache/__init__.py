"""The cache directory: namespaces of immutable parts, get-or-build, compaction, housekeeping."""
