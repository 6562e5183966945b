"""The measurements behind the scale estimates (``python -m benchmarks.scale`` runs
:mod:`.scale`)."""
