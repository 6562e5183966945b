"""The figures the guarantees page quotes (``python -m benchmarks.guarantees`` runs
:mod:`.guarantees`): how soon an interrupt or a kill stops a build, what sharing a store costs."""
