"""The cost of a loader's automatic fingerprint (``python -m benchmarks.fingerprint`` runs
:mod:`.fingerprint`)."""
