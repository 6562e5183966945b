"""What a value is to the walk: atomic, refused, named by its type, or read through its state.

* Atomic values (``None``, numbers, strings, bytes) are encoded exactly, each
  with its type (floats by ``float.hex``).
* What has no content to name it by is refused (:func:`refusal`): generators,
  open files, sockets, random generators, threads, frames.
* Synchronisation and per-thread objects are named by their type
  (:func:`sync_types`): a lock guarding a lazily loaded model, a queue, an
  executor, a ``threading.local`` say nothing of what a loader computes.
* An instance's state is read as pickle would (:func:`state_kind`): through the
  reduction a library class defines (``__reduce_ex__``, ``__reduce__`` or a
  ``copyreg`` entry: a ``Logger`` is ``getLogger(name)``, a compiled pattern
  its pattern and flags), else ``__getstate__``, else its attributes and slots.
"""

from __future__ import annotations

import copyreg
import functools
import io
import random
import socket
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["ENCODERS", "METADATA", "atomic", "find", "refusal", "slot_names", "state_kind", "sync_types"]

#: Attributes ``functools.update_wrapper`` copies: where and how a function is documented,
#: not what it computes (a wrapper's ``__wrapped__`` is digested instead).
METADATA = frozenset({*functools.WRAPPER_ASSIGNMENTS, "__type_params__"})

_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
# Synchronisation, communication and per-thread objects, by module (those of imported modules).
_SYNC = {
    "_thread": ("LockType", "RLock", "_local"),
    "threading": ("Condition", "Semaphore", "Event", "Barrier", "_RLock"),
    "queue": ("Queue", "SimpleQueue"),
    "multiprocessing.synchronize": ("SemLock", "Condition", "Event", "Barrier"),
    "multiprocessing.queues": ("Queue", "SimpleQueue"),
    "asyncio.locks": ("Lock", "Event", "Condition", "Semaphore", "Barrier"),
    "asyncio.queues": ("Queue",),
    "concurrent.futures": ("Executor",),
}


def _text(obj: str) -> bytes:
    return b"str:" + obj.encode("utf-8", "surrogatepass")


#: The exact encoding of each atomic type, with the type (floats by ``float.hex``, ints in hex:
#: no digit limit); no encoding starts with ``#``.
ENCODERS: dict[type, Callable[[Any], bytes]] = {
    str: _text,
    int: lambda obj: b"int:%x" % obj,
    bool: lambda obj: b"bool:True" if obj else b"bool:False",
    float: lambda obj: b"float:" + obj.hex().encode(),
    complex: lambda obj: b"complex:" + f"{obj.real.hex()},{obj.imag.hex()}".encode(),
    bytes: lambda obj: b"bytes:" + obj,
    bytearray: lambda obj: b"bytearray:" + bytes(obj),
    type(None): lambda obj: b"None",
    type(Ellipsis): lambda obj: b"Ellipsis",
    type(NotImplemented): lambda obj: b"NotImplemented",
}


def atomic(obj: Any) -> bytes | None:
    """The exact encoding of an atomic value with its type; None for other values.

    Examples
    --------
    >>> atomic(0.1), atomic("a"), atomic(True), atomic(255), atomic([1])
    (b'float:0x1.999999999999ap-4', b'str:a', b'bool:True', b'int:ff', None)
    """
    encode = ENCODERS.get(type(obj))
    return None if encode is None else encode(obj)


def refusal(obj: Any) -> str | None:
    """Why ``obj`` has no content to name it by, if it has none."""
    torch = sys.modules.get("torch")
    mro = type(obj).__mro__  # torch.Generator's isinstance() is slow: its metaclass's own
    # numpy.random's generators, if it was imported (nothing is one of them otherwise: the
    # package does not import it for this check)
    nprandom = sys.modules.get("numpy.random")
    drawing = () if nprandom is None else (
        nprandom.Generator, nprandom.RandomState, nprandom.BitGenerator)
    if isinstance(obj, _GENERATORS):
        return "a generator, whose state is where it has got to"
    if isinstance(obj, io.IOBase):
        return "an open file"
    if socket.socket in mro:
        return "a socket"
    if isinstance(obj, (random.Random, *drawing)) or (
        torch is not None and torch.Generator in mro
    ):
        return "a random generator, whose state moves with every draw"
    if isinstance(obj, threading.Thread):
        return "a thread"
    if isinstance(obj, (types.FrameType, types.TracebackType)):
        return "a running frame"
    return None


def sync_types() -> tuple[type, ...]:
    """The synchronisation and per-thread classes of the modules imported so far.

    Examples
    --------
    >>> import threading, queue
    >>> isinstance(threading.Lock(), sync_types()), isinstance(queue.Queue(), sync_types())
    (True, True)
    """
    return _sync_types(tuple(map(sys.modules.get, _SYNC)))


@functools.lru_cache(maxsize=8)
def _sync_types(modules: tuple[types.ModuleType | None, ...]) -> tuple[type, ...]:
    found = []
    for module, names in zip(modules, _SYNC.values(), strict=True):
        for name in names:
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                found.append(cls)
    return tuple(found)


def find(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name``."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)


@functools.lru_cache(maxsize=1024)
def slot_names(cls: type) -> tuple[str, ...]:
    """The names of the slots of ``cls`` and its bases, sorted."""
    names: list[str] = []
    for c in cls.__mro__:
        slots = vars(c).get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else list(slots))
    return tuple(sorted({n for n in names if n not in ("__dict__", "__weakref__")}))


def state_kind(cls: type, user: Callable[[type], bool]) -> Literal["reduce", "getstate", "fields"]:
    """How an instance of ``cls`` gives its state, as pickle would.

    ``"reduce"`` where a library class (``user(c)`` false) defines the
    reduction (``__reduce_ex__``/``__reduce__``, or ``copyreg`` has one for
    ``cls``); ``"getstate"`` where a class defines ``__getstate__`` first;
    ``"fields"`` (its attributes and slots) where only ``object`` does, or the
    user's own class defines the reduction.

    Examples
    --------
    >>> import logging, re
    >>> never = lambda c: False
    >>> state_kind(logging.Logger, never), state_kind(re.Pattern, never)
    ('reduce', 'reduce')
    >>> state_kind(logging.Handler, never)
    'fields'
    """
    if cls in copyreg.dispatch_table:
        return "reduce"
    for c in cls.__mro__:
        if c is object:
            break
        own = vars(c)
        if "__reduce_ex__" in own or "__reduce__" in own:
            return "fields" if user(c) else "reduce"
        if "__getstate__" in own:
            return "getstate"
    return "fields"
