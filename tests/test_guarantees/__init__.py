"""The guarantees end to end: killed builders, interrupts, hostile and damaged stores,
gc races, single flight, shared memory, permissions, holds, the soak, format 1."""
