"""The caching methods the benchmark compares, one module each.

Every module defines ``METHOD``, an instance of :class:`._base.Method`. All methods
decode with the same function (``tensorstore_cache.loaders.ImageLoader((32, 32))``), so
only the caching differs.
"""

from __future__ import annotations

import importlib

from ._base import Column, Method

__all__ = ["METHODS", "Column", "Method", "get"]

#: benchmark name -> module under benchmarks.common.methods, in table order
METHODS: dict[str, str] = {
    "no_cache": "no_cache",
    "manager_pil": "manager_pil",
    "manager_vectors": "manager_vectors",
    "torch_save": "torch_save",
    "hf_datasets": "hf_datasets",
    "zarr_api": "zarr_api",
    "tensorstore_cache": "tsc",
    "raw_memmap": "raw_memmap",
}


def get(name: str) -> Method:
    """The method called ``name``: a key of :data:`METHODS`, or ``"package.module:NAME"``
    for a :class:`Method` instance defined elsewhere (the test suite's methods that fail
    on purpose live in ``tests/``, not in this registry)."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise KeyError(f"method {name!r}: {exc}") from None
        if not isinstance(found, Method):
            raise KeyError(f"method {name!r} is a {type(found).__name__}, not a Method")
        return found
    try:
        module = METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; choose from {', '.join(METHODS)} "
                       "(or give package.module:NAME)") from None
    method: Method = importlib.import_module(f"{__name__}.{module}").METHOD
    return method
