"""The sweep benchmark: a real Optuna study whose every trial is a fresh process
(``python -m benchmarks.sweep`` runs :mod:`.sweep`; each trial is
``python -m benchmarks.sweep.sweep_trial``)."""
