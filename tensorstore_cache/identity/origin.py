"""Where code comes from: the user's own (named by value) or a library's (named by name).

User code is code whose file lies outside the interpreter's standard library
and site-packages directories (``sysconfig``'s ``stdlib``, ``platstdlib``,
``purelib`` and ``platlib``, and the user site-packages), or that has no file
(a script run through ``python -c`` or stdin, a notebook cell, ``exec``).
Everything else is library code, named by its module and qualified name, with
the version of the distribution it belongs to recorded beside it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import site
import sys
import sysconfig
import types
from typing import Any

__all__ = [
    "distribution_version",
    "is_stdlib",
    "is_user_class",
    "is_user_file",
    "is_user_module",
    "library_name",
]


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """The real paths of the directories that hold library code, longest first."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE is not False else None
    if isinstance(user_site, str):
        roots.add(user_site)
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted({os.path.realpath(r) for r in roots}, key=len, reverse=True))


@functools.cache
def is_user_file(filename: str | None) -> bool:
    """Whether code compiled from ``filename`` is the user's own.

    Examples
    --------
    >>> import json
    >>> is_user_file(json.__file__), is_user_file("<string>"), is_user_file(None)
    (False, True, True)
    """
    if not filename:
        return True
    if filename.startswith("<frozen "):
        return False
    if filename.startswith("<"):
        return True
    real = os.path.realpath(filename)
    return not any(real == r or real.startswith(r + os.sep) for r in _library_roots())


def is_user_module(module: types.ModuleType) -> bool:
    """Whether ``module`` is the user's own (``__main__`` included, built-in modules not)."""
    name = module.__name__
    if name in sys.builtin_module_names:
        return False
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.origin in ("built-in", "frozen"):
        return False
    file = getattr(module, "__file__", None)
    return is_user_file(file if isinstance(file, str) else None)


def is_user_class(cls: type) -> bool:
    """Whether ``cls`` is the user's own: decided by the module it was defined in.

    A class's members say nothing of where it was written (an ``Enum``'s first
    function is the standard library's, a ``NamedTuple``'s or a slots
    dataclass's too), its module does: the user's own module (``__main__``
    included), else a library's. A class whose module is not imported (code
    run with ``exec`` under a name of its own) is the user's unless a function
    written in its body lies in a library file.

    Examples
    --------
    >>> import json
    >>> is_user_class(json.JSONDecoder), is_user_class(int)
    (False, False)
    """
    module = sys.modules.get(cls.__module__)
    if module is not None:
        return is_user_module(module)
    prefix = f"{cls.__qualname__}."
    for member in vars(cls).values():
        fn = getattr(member, "__func__", member)
        if isinstance(fn, types.FunctionType) and fn.__qualname__.startswith(prefix):
            return is_user_file(fn.__code__.co_filename)
    return True


def is_stdlib(module_name: str) -> bool:
    """Whether ``module_name`` belongs to the standard library."""
    return module_name.partition(".")[0] in sys.stdlib_module_names


def library_name(obj: Any) -> str:
    """The qualified name a library object is known by, ``module.qualname``."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if not isinstance(qualname, str):
        qualname = type(obj).__qualname__
    return f"{module}.{qualname}" if isinstance(module, str) else qualname


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@functools.cache
def distribution_version(module_name: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed package holding ``module_name``, if any.

    Examples
    --------
    >>> distribution_version("numpy")[0]
    'numpy'
    >>> distribution_version("json") is None  # the standard library
    True
    """
    top = module_name.partition(".")[0]
    if top in sys.stdlib_module_names or top == "__main__":
        return None
    for guess in (top, top.replace("_", "-")):  # most distributions are named as they import
        try:
            return guess, importlib.metadata.version(guess)
        except importlib.metadata.PackageNotFoundError:
            pass
    for dist in sorted(_distributions().get(top, [])):  # reads every installed distribution
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
