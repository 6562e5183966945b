"""Unit tests, one module per layer of the package (lowest first: config, fs, format, remote, reader, writer, cache)."""
