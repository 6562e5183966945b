"""Files: safe opening, bounded JSON, durable writes and renames, temporary directories, locks."""
