"""Writing a store: shard tasks run by a process pool, assembly, atomic publication."""
