"""Micro-benchmarks of the core (``python -m benchmarks.micro`` runs :mod:`.micro`)."""
