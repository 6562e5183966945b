"""The benchmarks run end to end at a tiny size; their reports and measuring parts are sound."""
