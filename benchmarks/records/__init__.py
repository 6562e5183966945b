"""The records benchmark: covers, title token ids and ratings, against the peers
(``python -m benchmarks.records`` runs :mod:`.records`)."""
