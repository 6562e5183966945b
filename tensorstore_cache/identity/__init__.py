"""Naming a loader by what it computes: the automatic fingerprint of a loader.

A loader given to ``cached()`` without a ``loader_id`` is named
``auto:<qualname>/<digest>``, a digest of its code (without line numbers,
comments or its docstring), its defaults, closure contents and every global
it reads, through the user's own code by value and into libraries by name,
with arrays and tensors by their bytes under a cap. See :func:`loader_fingerprint`.

The layers above import only the names listed here (``from ..identity import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .origin import distribution_version
    from .report import (
        AUTO_PREFIX,
        LoaderFingerprint,
        check_loader_id,
        explain_change,
        loader_fingerprint,
        moving_components,
    )

#: Every name of the interface, by the module defining it.
_MODULES = {
    "origin": ("distribution_version",),
    "report": ("AUTO_PREFIX", "LoaderFingerprint", "check_loader_id", "explain_change",
               "loader_fingerprint", "moving_components"),
}

__all__ = [
    "AUTO_PREFIX",
    "LoaderFingerprint",
    "check_loader_id",
    "distribution_version",
    "explain_change",
    "loader_fingerprint",
    "moving_components",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
