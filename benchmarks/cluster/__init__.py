"""What copied sources cost with ``cached(remote=...)`` (``python -m benchmarks.cluster`` runs
:mod:`.copied`)."""
