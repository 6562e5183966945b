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
    from .origin import distribution_version, is_user_file
    from .report import (
        AUTO_PREFIX,
        CAP_ENV,
        LoaderFingerprint,
        check_loader_id,
        default_cap,
        explain_change,
        loader_fingerprint,
        loader_name,
        moving_components,
    )
    from .values import DEFAULT_CAP, EXECUTION_SETTINGS, Component

#: Every name of the interface, by the module defining it.
_MODULES = {
    "origin": ("distribution_version", "is_user_file"),
    "report": ("AUTO_PREFIX", "CAP_ENV", "LoaderFingerprint", "check_loader_id", "default_cap",
               "explain_change",
               "loader_fingerprint", "loader_name", "moving_components"),
    "values": ("Component", "DEFAULT_CAP", "EXECUTION_SETTINGS"),
}

__all__ = [
    "AUTO_PREFIX",
    "CAP_ENV",
    "Component",
    "DEFAULT_CAP",
    "EXECUTION_SETTINGS",
    "LoaderFingerprint",
    "check_loader_id",
    "default_cap",
    "distribution_version",
    "explain_change",
    "is_user_file",
    "loader_fingerprint",
    "loader_name",
    "moving_components",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
