"""Lazy interfaces: a subpackage's ``__init__`` names what the layers above may import.

Each subpackage lists its interface (the names the layers above import, and
the module defining each) and hands it to :func:`interface`; a name is
imported from its module the first time it is used (PEP 562), so importing
:mod:`tensorstore_cache` loads only what it needs.

Examples
--------
>>> import tensorstore_cache.reader as reader
>>> reader.CacheStore.__name__
'CacheStore'
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["interface"]


def interface(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return the ``__getattr__`` and ``__dir__`` of ``package`` exporting ``modules``' names.

    Parameters
    ----------
    package
        The subpackage (its ``__name__``).
    modules
        Module name (relative to ``package``) -> the names of the interface it defines.
    """
    where = {name: module for module, names in modules.items() for name in names}

    def get_attr(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    def list_names() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return get_attr, list_names
