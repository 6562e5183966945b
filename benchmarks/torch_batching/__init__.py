"""DataLoader epochs over a StoreDataset (``python -m benchmarks.torch_batching`` runs
:mod:`.torch_batching`)."""
