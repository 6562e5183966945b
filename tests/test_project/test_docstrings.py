"""Every parameter of every public function and method is documented, by its name.

The numpydoc ``Parameters`` section of each function of the public API
(``tensorstore_cache`` and ``tensorstore_cache.torch``), of each public method
of its classes and of each constructor written by hand (a class documents its
constructor in its own docstring or in ``__init__``'s) names exactly the
parameters of its signature. A dataclass's generated constructor takes its
fields, each documented where it is declared; an error's constructor is the
library's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tensorstore_cache as tsc

_SECTION = re.compile(r"^Parameters\n-+\n(.*?)(?:^\S[^\n]*\n-+\n|\Z)", re.S | re.M)


def documented(doc: str | None) -> list[str] | None:
    """The parameter names a numpydoc ``Parameters`` section lists (None: no section)."""
    if not doc:
        return None
    found = _SECTION.search(inspect.cleandoc(doc))
    if found is None:
        return None
    names: list[str] = []
    for line in found.group(1).splitlines():
        if line and not line[0].isspace():
            names += [n.strip().lstrip("*") for n in line.split(" : ")[0].split(",")]
    return names


def parameters(fn: Callable[..., Any]) -> list[str]:
    """The parameters of ``fn``'s signature, ``self`` and ``cls`` aside."""
    return [n for n in inspect.signature(fn).parameters if n not in ("self", "cls")]


def public_callables() -> Iterator[tuple[str, Callable[..., Any], str | None]]:
    """``(name, function, docstring documenting it)`` of every public function and method."""
    import tensorstore_cache.torch as tsc_torch

    for module in (tsc, tsc_torch):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj, obj.__doc__
            elif inspect.isclass(obj):
                yield from _methods(f"{module.__name__}.{name}", obj)


def _methods(label: str, cls: type) -> Iterator[tuple[str, Callable[..., Any], str | None]]:
    init = cls.__dict__.get("__init__")
    generated = dataclasses.is_dataclass(cls) or issubclass(cls, BaseException)
    if inspect.isfunction(init) and not generated:
        own = documented(cls.__doc__) is not None
        yield f"{label}.__init__", init, cls.__doc__ if own else init.__doc__
    for name, member in cls.__dict__.items():
        fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if not name.startswith("_") and inspect.isfunction(fn):
            yield f"{label}.{name}", fn, fn.__doc__


CALLABLES = sorted(public_callables(), key=lambda c: c[0])


def test_the_public_api_has_functions_and_methods_to_check() -> None:
    names = {name for name, _fn, _doc in CALLABLES}
    assert {"tensorstore_cache.cached", "tensorstore_cache.build_store",
            "tensorstore_cache.BatchLoader.__init__", "tensorstore_cache.CacheStore.stale",
            "tensorstore_cache.torch.StoreDataset.dataloader"} <= names


@pytest.mark.parametrize(("name", "fn", "doc"), CALLABLES, ids=[c[0] for c in CALLABLES])
def test_every_parameter_is_documented_by_name(
    name: str, fn: Callable[..., Any], doc: str | None
) -> None:
    wanted = parameters(fn)
    if not wanted:
        return
    listed = documented(doc)
    assert listed is not None, f"{name} has parameters {wanted} but no Parameters section"
    assert sorted(listed) == sorted(wanted), f"{name}: documented {listed}, signature {wanted}"


def test_the_check_sees_an_undocumented_parameter() -> None:
    def f(a: int, b: int) -> None:
        """Do.

        Parameters
        ----------
        a
            One.
        """

    assert documented(f.__doc__) == ["a"] != parameters(f)
    assert documented("No section.") is None
