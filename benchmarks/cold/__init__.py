"""Cold builds and first reads, stamped and timed in fresh processes."""
