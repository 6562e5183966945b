"""``python -m tensorstore_cache``: the ``tensorstore-cache`` command."""

from .cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
