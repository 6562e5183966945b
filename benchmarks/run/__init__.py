"""The main benchmark: the caching methods side by side in fresh agent processes
(``python -m benchmarks.run`` runs :mod:`.run`; :mod:`.hf_features` is its study of the
``datasets`` feature types)."""
