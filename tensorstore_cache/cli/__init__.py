"""The ``tensorstore-cache`` command."""
