"""Lazy remote stores against a real S3 API (``python -m benchmarks.remote`` runs
:mod:`.remote`)."""
