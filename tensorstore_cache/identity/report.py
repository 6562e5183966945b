"""A loader's automatic fingerprint, its components, and why it moved.

:func:`loader_fingerprint` digests a loader (see :mod:`.walk`) together with
the Python bytecode tag: an upgrade of Python gives a new fingerprint once,
never a wrong hit. The id a cache names it by is ``auto:<qualname>/<digest>``,
which never equals an explicit ``loader_id`` (those cannot start with ``auto:``
and be named by a digest of this form). :func:`explain_change` says in one line
what differs between two fingerprints' components, :func:`moving_components`
what keeps moving between several.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .origin import distribution_version
from .values import DEFAULT_CAP, Component, digest
from .walk import Walker

__all__ = [
    "AUTO_PREFIX",
    "CAP_ENV",
    "LoaderFingerprint",
    "check_loader_id",
    "default_cap",
    "explain_change",
    "loader_fingerprint",
    "loader_name",
    "moving_components",
]

#: Prefix of every automatic loader id.
AUTO_PREFIX = "auto:"
#: Environment variable overriding :data:`~.walk.DEFAULT_CAP` (bytes; ``K``/``M``/``G`` suffixes).
CAP_ENV = "TSC_FINGERPRINT_CAP"
_VERSION = b"tensorstore_cache.loader-fingerprint/2"


def default_cap() -> int:
    """The cap on array and tensor bytes: ``TSC_FINGERPRINT_CAP`` or 256 MiB.

    Raises
    ------
    ValueError
        If ``TSC_FINGERPRINT_CAP`` is not a whole number of bytes (``K``, ``M``, ``G`` allowed).
    """
    text = os.environ.get(CAP_ENV, "").strip()
    if not text:
        return DEFAULT_CAP
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    number = text[:-1] if scale > 1 else text
    if not number.isdigit():
        raise ValueError(f"{CAP_ENV}={text!r} must be a whole number of bytes, e.g. 512M")
    return int(number) * scale


def check_loader_id(loader_id: object, attribute: bool = False) -> str:
    """An explicit loader id, checked: a string, not empty, not starting with ``auto:``.

    ``attribute``: it is the loader's ``loader_id`` attribute, not the argument.

    Raises
    ------
    TypeError
        If it is not a string.
    ValueError
        If it is empty or starts with ``auto:`` (the automatic ids' prefix).

    Examples
    --------
    >>> check_loader_id("myproject.thumbs/1")
    'myproject.thumbs/1'
    >>> check_loader_id("", attribute=True)
    Traceback (most recent call last):
    ...
    ValueError: the loader's loader_id attribute '' is empty: give a name such as ...
    """
    given = f"the loader's loader_id attribute {loader_id!r}" if attribute \
        else f"loader_id={loader_id!r}"
    if not isinstance(loader_id, str):
        raise TypeError(f"{given} must be a string naming what the loader computes, such as "
                        "'myproject.thumbs/1'")
    if not loader_id.strip():
        raise ValueError(f"{given} is empty: give a name such as 'myproject.thumbs/1' (change "
                         "it whenever the loader's output changes), or none at all, and the "
                         "loader is named by what it computes")
    if loader_id.startswith(AUTO_PREFIX):
        raise ValueError(f"{given}: ids starting with {AUTO_PREFIX!r} are the automatic ones (a "
                         "loader without a loader_id gets one); choose another")
    return loader_id


def loader_name(fn: Any) -> str:
    """The qualified name a loader's automatic id starts with."""
    if isinstance(fn, functools.partial):
        return loader_name(fn.func)
    if isinstance(fn, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return str(fn.__qualname__)
    return type(fn).__qualname__


@dataclass(frozen=True)
class LoaderFingerprint:
    """What names a loader: its fingerprint, the components it was made of, library versions.

    Examples
    --------
    >>> SIZE = 4
    >>> fp = tsc.loader_fingerprint(lambda path: np.zeros(SIZE))
    >>> fp.loader_id.startswith("auto:<lambda>/"), fp.components[1].path
    (True, '<lambda> -> global SIZE')
    """

    fingerprint: str
    """Hex digest of everything the loader computes with."""
    name: str
    """The loader's qualified name."""
    components: tuple[Component, ...]
    """Each part, with the path that reaches it, user or library, its digest and bytes."""
    modules: tuple[str, ...] = ()
    """Top-level names of the library modules it uses."""
    python: str = ""
    """The bytecode tag it was taken under, e.g. ``"cpython-311"``."""
    seconds: float = 0.0
    """How long taking it took."""
    retake: Callable[[], LoaderFingerprint] | None = field(default=None, repr=False,
                                                           compare=False)
    """Takes the same loader's fingerprint again (to see whether it moved)."""

    @property
    def loader_id(self) -> str:
        """The id a cache names it by: ``auto:<qualname>/<first 16 hex digits>``."""
        return f"{AUTO_PREFIX}{self.name}/{self.fingerprint[:16]}"

    @functools.cached_property
    def versions(self) -> dict[str, str]:
        """``distribution -> version`` of the libraries it uses (recorded, not digested)."""
        found = (distribution_version(m) for m in self.modules)
        return dict(sorted(v for v in found if v is not None))

    @property
    def nbytes(self) -> int:
        """Bytes of array and tensor data digested."""
        return sum(c.nbytes for c in self.components)

    def to_json(self) -> dict[str, Any]:
        """Its components and versions as JSON values (kept beside a namespace's parts)."""
        return {
            "loader_id": self.loader_id, "python": self.python, "versions": dict(self.versions),
            "components": [[c.path, c.origin, c.digest, c.nbytes] for c in self.components],
        }

    def __str__(self) -> str:
        lines = [f"{self.loader_id}  ({self.python}, {len(self.components)} components, "
                 f"{self.nbytes} bytes of arrays)"]
        lines += [f"  {c.origin:<7} {c.digest[:12]}  {c.path}"
                  + (f"  [{c.nbytes} bytes]" if c.nbytes else "") for c in self.components]
        if self.versions:
            lines.append("  versions: " + ", ".join(f"{k}=={v}" for k, v in
                                                    sorted(self.versions.items())))
        return "\n".join(lines)


def loader_fingerprint(
    loader: Any, *, cap: int | None = None, also: Mapping[str, Any] | None = None
) -> LoaderFingerprint:
    """Name ``loader`` by what it computes, as ``cached()`` does when it has no ``loader_id``.

    Parameters
    ----------
    loader
        A function, lambda, nested function, ``functools.partial``, bound
        method or callable object (a ``BatchLoader`` too: its execution
        settings, batch size and devices, are left out).
    cap
        Bytes of array and tensor data read at most; default
        ``TSC_FINGERPRINT_CAP`` or 256 MiB.
    also
        Other values that determine what the loader computes, by name (a
        ``prepare`` function given beside it), fingerprinted the same way.

    Returns
    -------
    LoaderFingerprint

    Raises
    ------
    UnnamedLoaderError
        If the loader holds something with no content to name it by (an open
        file, a socket, a generator, a random generator, an opaque extension
        object, ``nonlocal`` writes, arrays past the cap); the message gives the
        path to it.
    """
    start = time.perf_counter()
    name = loader_name(loader)
    walker = Walker(name, default_cap() if cap is None else cap)
    root = walker.value(loader, name, named=True)
    extra = [p for key, value in sorted((also or {}).items())
             for p in (key.encode(), walker.value(value, f"{name} -> {key}", named=True))]
    tag = str(sys.implementation.cache_tag)
    whole = digest(_VERSION, tag.encode(), importlib.util.MAGIC_NUMBER, root, *extra)
    return LoaderFingerprint(
        fingerprint=whole.hex(), name=name, components=tuple(walker.components.values()),
        modules=tuple(sorted(walker.modules)), python=tag,
        seconds=time.perf_counter() - start,
        retake=lambda: loader_fingerprint(loader, cap=cap, also=also),
    )


def _innermost(paths: list[str]) -> list[str]:
    """The paths none of whose own parts (``p -> ...``, ``p.x``, ``p[k]``) are listed too."""
    return [p for p in paths if not any(q.startswith((f"{p} -> ", f"{p}.", f"{p}["))
                                        for q in paths)]


def _changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    changed = [p for p in new if p in old and old[p] != new[p]]
    changed += [p for p in new if p not in old]
    changed += [p for p in old if p not in new]
    return _innermost(changed)


def _describe(path: str, old: Mapping[str, str], new: Mapping[str, str]) -> str:
    last = path.rsplit(" -> ", 1)[-1]
    kind, _, label = last.partition(" ")
    what = f"{kind} `{label}`" if label and kind in ("helper", "global", "class", "module",
                                                     "closure", "defaults") else f"`{last}`"
    if path not in old:
        return f"{what} is new ({path})"
    if path not in new:
        return f"{what} is no longer used ({path})"
    return f"{what} changed" + ("" if path == last else f" ({path})")


def explain_change(old: Iterable[Component | list[Any]], new: Iterable[Component],
                   old_python: str = "", new_python: str = "") -> str:
    """One line saying what differs between two fingerprints' components.

    ``old`` may be the components as :meth:`LoaderFingerprint.to_json` wrote them.
    """
    if old_python and new_python and old_python != new_python:
        return f"the Python bytecode tag changed ({old_python} -> {new_python})"
    before = {(c.path if isinstance(c, Component) else str(c[0])):
              (c.digest if isinstance(c, Component) else str(c[2])) for c in old}
    after = {c.path: c.digest for c in new}
    changes = _changes(before, after)
    if not changes:
        return "no component changed (the fingerprint's version did)"
    said = [_describe(p, before, after) for p in changes[:3]]
    more = f", and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "; ".join(said) + more


def moving_components(runs: Iterable[Iterable[list[Any]]]) -> list[str]:
    """The paths of components whose digest differs in every one of several fingerprints.

    The innermost only: a component none of whose own parts moved each time too.
    """
    seen: dict[str, set[str]] = {}
    count = 0
    for components in runs:
        count += 1
        for c in components:
            seen.setdefault(str(c[0]), set()).add(str(c[2]))
    return _innermost([p for p, digests in seen.items() if len(digests) == count > 1])
