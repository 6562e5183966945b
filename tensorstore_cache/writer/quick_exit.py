"""A worker's quick exit: once it has served its build, no interpreter teardown.

A fresh worker of a build's pool (a CPU worker or a device worker; a forked one
leaves by :func:`os._exit`, see :mod:`.forked`) that served its build to the end
skips the interpreter's final teardown, which the build
would wait for (about a second for a framework such as torch, a tenth of one
for numpy and Pillow on a loaded machine) (:func:`exit_quickly`): the
``atexit`` handlers still run (the loader's, its framework's, logging's),
the file objects left open are closed (as the teardown would), and then the
process exits at once. One that failed exits as usual.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import sys
import weakref
from typing import Any

__all__ = ["exit_quickly", "served"]

#: Set in a worker once it has served its build to the end (see :func:`exit_quickly`).
_served: list[bool] = []


def served() -> None:
    """In a worker: note that it has served its build to the end (it may exit quickly)."""
    _served.append(True)


def _inner(obj: Any) -> list[Any]:
    """What a file object holds (a wrapper's wrapped file among them)."""
    held = gc.get_referents(obj)
    return held + [v for d in held if isinstance(d, dict) for v in d.values()]


def _depth(obj: Any) -> tuple[bool, bool]:
    """How deep a file object of a wrapping cycle sits, by its type (lower: close it first):
    a raw stream last, then io's own buffers, a Python-level wrapper (a GzipFile) first."""
    kind = type(obj)
    return issubclass(kind, io.RawIOBase), kind.__module__ in ("_io", "io")


def exit_quickly() -> None:
    """At exit, once this worker has served its build: finish what the teardown would,
    then exit without it.

    Registered with :mod:`atexit` before the worker unpickles its loader, so
    that it runs after every handler registered since (the loader's, its
    framework's); it runs those registered before it that matter itself
    (logging's, :class:`weakref.finalize`'s), then closes the file objects
    left open, each wrapper before the file it wraps (a ``GzipFile`` before
    its file, text before its buffer), as collecting them would, and exits
    with status 0 (:func:`os._exit`). A worker that failed exits as usual.
    """
    if not _served:
        return
    with contextlib.suppress(Exception):
        logging.shutdown()
    with contextlib.suppress(Exception):
        weakref.finalize._exitfunc()  # type: ignore[attr-defined]
    # by type, never an object's own attributes (some warn when looked at): io's classes,
    # and every file class built on them, derive from its C base
    base = io.IOBase.__mro__[1]
    objects = gc.get_objects()
    kinds = {kind for kind in {type(obj) for obj in objects} if base in kind.__mro__}
    files = {id(obj): obj for obj in objects if type(obj) in kinds}
    std = [s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None]
    keep = {id(s) for s in std} | {id(getattr(s, "buffer", None)) for s in std}
    keep |= {id(getattr(getattr(s, "buffer", None), "raw", None)) for s in std}
    wraps = {i: {id(x) for x in _inner(f) if id(x) in files and id(x) != i}
             for i, f in files.items()}
    left = set(files)
    while left:  # the outermost first: no file left wraps them
        wrapped = {j for i in left for j in wraps[i]}
        # a cycle (since Python 3.12 a GzipFile being written, its buffer and the raw stream
        # under it hold each other): the wrapper of the three first, one at a time
        outer = [i for i in left if i not in wrapped] or [min(left, key=lambda i: _depth(files[i]))]
        for i in outer:
            left.discard(i)
            with contextlib.suppress(Exception):
                if not files[i].closed:
                    files[i].flush()
                    if i not in keep:
                        files[i].close()
    os._exit(0)
