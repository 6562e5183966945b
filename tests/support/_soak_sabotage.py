"""Sabotages of the cache for the soak (:mod:`tests.support.soak`): test-only, never a setting.

A soak run with ``--sabotage NAME`` applies :data:`SABOTAGES` ``[NAME]`` in every process of
the run as it starts (each role, before its first call), so that the cache is broken on
purpose and the run's checks must report it. ``stale``: ``cached()`` never finds a source
changed (its staleness check returns nothing), so a source rewritten after its entry was
built keeps returning the old version's vector: the callers' check must report stale
vectors, and the final check wrong ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["SABOTAGES", "apply"]


def _nothing_is_stale() -> None:
    planning = importlib.import_module("tensorstore_cache.cache.cached")

    def stale_keys(*_args: Any, **_kwargs: Any) -> list[str]:
        return []

    assert callable(getattr(planning, "stale_keys", None))  # what cached() plans with
    setattr(planning, "stale_keys", stale_keys)  # noqa: B010 - a module found by name


SABOTAGES: dict[str, Callable[[], None]] = {"stale": _nothing_is_stale}


def apply(name: str | None) -> None:
    """Apply the sabotage ``name`` in this process (None: none)."""
    if name is not None:
        SABOTAGES[name]()
