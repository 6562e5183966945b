"""Digesting values: atomic ones exactly, containers by their items, data by its bytes,
instances by their class and their state.

:class:`ValueWalk` is the part of the walk (:mod:`.walk`) that needs no code:
it keeps the memo, the cycle guard, the depth and the cap, and digests
containers (lists and tuples in order, dicts in insertion order, which a loader
iterating one sees, sets sorted), numpy arrays and torch tensors by their full
bytes, enums by their class, name and value, and instances by their class and
their state read as pickle would (:func:`.kinds.state_kind`). What a loader's
code reads (functions, classes, modules) is digested by :class:`.walk.Walker`.
"""

from __future__ import annotations

import array
import collections
import copyreg
import enum
import functools
import hashlib
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnnamedLoaderError
from ..loaders import BatchLoader
from .kinds import ENCODERS, METADATA, atomic, refusal, slot_names, state_kind, sync_types
from .origin import is_user_class, is_user_module

__all__ = ["Component", "DEFAULT_CAP", "EXECUTION_SETTINGS", "MAX_DEPTH", "ValueWalk", "digest"]

#: Bytes a fingerprint reads at most (256 MiB): of arrays and tensors, and of Python containers
#: (their size in memory and their items' encoded size).
DEFAULT_CAP = 256 * 2**20
#: Levels of nested values a fingerprint follows at most (a deeper structure is refused).
MAX_DEPTH = 100
#: Settings of where and how a BatchLoader runs, not of what it computes.
EXECUTION_SETTINGS = frozenset({"batch_size", "devices", "device", "executor"})
_POINTERS = 16  # what a class defined in Python adds beyond its slots: __dict__, __weakref__
_LONG_PATH = 240


def digest(*parts: bytes) -> bytes:
    """The BLAKE2b digest (16 bytes) of ``parts``: their number, their lengths, their bytes."""
    lengths = array.array("Q", map(len, parts))
    if sys.byteorder == "big":
        lengths.byteswap()
    h = hashlib.blake2b(len(parts).to_bytes(8, "little"), digest_size=16)
    h.update(lengths)
    h.update(b"".join(parts))
    return h.digest()


@dataclass(frozen=True)
class Component:
    """One part of a loader's fingerprint."""

    path: str
    """How the loader reaches it, e.g. ``"image_vector -> helper resize_to"``."""
    origin: str
    """``"user"`` (digested by value) or ``"library"`` (by qualified name)."""
    digest: str
    """Its own digest (hex): a function's code, a value's content."""
    nbytes: int = 0
    """Bytes of array or tensor data it holds."""


@functools.lru_cache(maxsize=1024)
def _hidden_state(cls: type) -> bool:
    """Whether a class of ``cls``'s MRO keeps state in C, out of ``__dict__`` and slots.

    A class defined in Python adds to its base's size its slots and at most the
    pointers to a ``__dict__`` and weak references; one that adds more (``int``,
    ``BaseException``, an extension's or pybind11's object) holds state that
    only its pickle reduction can give.
    """
    for c in cls.__mro__[:-1]:
        base = c.__base__ or object
        own = vars(c).get("__slots__", ())
        slots = 1 if isinstance(own, str) else len(own)
        if c.__itemsize__ != base.__itemsize__ or \
                c.__basicsize__ - base.__basicsize__ - 8 * slots > _POINTERS:
            return True
    return False


def _attributes(obj: Any) -> dict[str, Any] | None:
    """``obj``'s attributes and slots without wrapper metadata; None if it has neither."""
    cls: type = type(obj)
    slots = slot_names(cls)
    found = getattr(obj, "__dict__", None)
    if not isinstance(found, dict) and not slots and _hidden_state(cls):
        return None
    fields = dict(found) if isinstance(found, dict) else {}
    fields.update((n, getattr(obj, n)) for n in slots if hasattr(obj, n))
    return {k: v for k, v in fields.items() if k not in METADATA}


def _empty(value: Any) -> bool:
    return isinstance(value, (list, tuple, dict, set, frozenset)) and not value


def _short(path: str) -> str:
    return path if len(path) <= _LONG_PATH else f"{path[:120]} ... {path[-100:]}"


class ValueWalk:
    """Digests values reachable from a loader, recording its components.

    Parameters
    ----------
    root
        The loader's name, for messages.
    cap
        Bytes of arrays, tensors and Python containers read at most.
    """

    def __init__(self, root: str, cap: int = DEFAULT_CAP) -> None:
        self.root = root
        self.cap = cap
        self.spent = 0
        """Bytes counted against the cap so far."""
        self.components: dict[str, Component] = {}
        self.modules: set[str] = set()
        """Top-level names of the library modules it uses (their versions are recorded)."""
        self._memo: dict[int, bytes] = {}
        self._keep: list[Any] = []  # what the memo's ids refer to stays alive
        self._stack: dict[int, int] = {}
        self._sync = sync_types()

    def refuse(self, path: str, obj: Any, why: str) -> UnnamedLoaderError:
        """The error for what has no content to name it by, with the path that led there."""
        where = f"{_short(path)} ({self._type_name(obj)})"
        return UnnamedLoaderError(
            f"cached() needs a loader_id for the loader {self.root!r}: it cannot be named by "
            f"what it computes, because {where} is {why}. Pass loader_id='myproject.name/1' "
            "(change it whenever the loader's output changes), or create that object inside "
            "the loader (or in a BatchLoader's setup()) rather than holding it", where)

    @staticmethod
    def _type_name(obj: Any) -> str:
        cls: type = type(obj)
        return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" \
            else cls.__qualname__

    def _record(self, path: str, origin: str, d: bytes, nbytes: int = 0) -> None:
        self.components.setdefault(path, Component(path, origin, d.hex(), nbytes))

    def _spend(self, nbytes: int, path: str) -> None:
        self.spent += nbytes
        if self.spent > self.cap:
            raise UnnamedLoaderError(
                f"cached() needs a loader_id for the loader {self.root!r}: its arrays, tensors "
                f"and Python containers hold more than the fingerprint's cap of {self.cap} bytes "
                f"({_short(path)} takes it to {self.spent}). Pass loader_id='myproject.name/1', "
                "or raise the cap (TSC_FINGERPRINT_CAP, or loader_fingerprint(..., cap=))", path)

    def value(self, obj: Any, path: str, named: bool = False) -> bytes:
        """The digest of ``obj`` reached by ``path`` (``named``: a component of its own)."""
        encoded = atomic(obj)
        if encoded is not None:
            d = digest(encoded)
            if named:
                self._record(path, "user", d)
            return d
        key = id(obj)
        if key in self._stack:
            return digest(b"cycle", str(len(self._stack) - self._stack[key]).encode())
        if key in self._memo:
            return self._memo[key]
        if len(self._stack) >= MAX_DEPTH:
            raise self.refuse(path, obj, f"nested more than {MAX_DEPTH} levels deep")
        self._stack[key] = len(self._stack)
        try:
            d = self._dispatch(obj, path, named)
        except RecursionError:  # a deep stack below the loader: said once, where it happened
            raise self.refuse(path, obj, "nested deeper than Python's recursion limit allows "
                              f"here ({sys.getrecursionlimit()} frames)") from None
        finally:
            del self._stack[key]
        self._memo[key] = d
        self._keep.append(obj)
        return d

    def _dispatch(self, obj: Any, path: str, named: bool) -> bytes:
        """The digest of a value that is not atomic (:class:`.walk.Walker` adds code)."""
        d = self._data(obj, path)
        if d is None:
            d = self._container(obj, path)
        if d is None:
            why = refusal(obj)
            if why is not None:
                raise self.refuse(path, obj, why)
            return self._instance(obj, path)
        if named:
            self._record(path, "user", d)
        return d

    def _library_name(self, name: str, path: str) -> bytes:
        top = name.partition(".")[0]
        if top in sys.modules and top not in sys.stdlib_module_names:
            self.modules.add(top)
        d = digest(b"library", name.encode())
        self._record(path, "library", d)
        return d

    def _data(self, obj: Any, path: str) -> bytes | None:
        """Arrays, tensors, enums and other values of a known layout; None for others."""
        torch = sys.modules.get("torch")
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:  # strings of an older pandas' index, say: item by item
                if obj.dtype != np.dtype(object):
                    raise self.refuse(path, obj, "an array of records holding Python objects")
                items = self.value(obj.ravel().tolist(), path)
                return digest(b"object array", repr(obj.shape).encode(), items)
            return self._bytes(path, b"ndarray", str(obj.dtype.descr), obj.shape,
                               np.ascontiguousarray(obj))
        if isinstance(obj, (np.generic, np.dtype)):
            return digest(b"numpy", repr(obj.dtype if isinstance(obj, np.generic) else obj)
                          .encode(), np.asarray(obj).tobytes() if isinstance(obj, np.generic)
                          else b"")
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.is_sparse or obj.device.type == "meta" or obj.is_quantized:
                raise self.refuse(path, obj, "a tensor without plain dense data")
            flat = obj.detach().cpu().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
            return self._bytes(path, b"tensor", str(obj.dtype), tuple(obj.shape), data)
        if torch is not None and isinstance(obj, (torch.dtype, torch.device)):
            return digest(b"torch", str(obj).encode())
        if isinstance(obj, enum.Enum):  # a flag's combination may have no name
            cls: type = type(obj)
            own = self.value(cls, f"{path} -> class {cls.__qualname__}")
            return digest(b"enum", own, str(obj._name_).encode(),
                          self.value(obj._value_, f"{path} -> value"))
        if isinstance(obj, memoryview):
            return digest(b"memoryview", obj.tobytes())
        return None

    def _bytes(self, path: str, kind: bytes, dtype: str, shape: tuple[int, ...],
               data: Any) -> bytes:
        self._spend(int(data.nbytes), path)
        h = hashlib.blake2b(digest_size=16)
        h.update(memoryview(data).cast("B"))
        d = digest(kind, dtype.encode(), repr(shape).encode(), h.digest())
        self._record(path, "user", d, int(data.nbytes))
        return d

    def _item(self, item: Any, path: str) -> bytes:
        """An item of a container that is not atomic (an atomic one is its encoding)."""
        return b"#" + self.value(item, path)  # no atomic encoding starts with "#"

    def _container(self, obj: Any, path: str) -> bytes | None:
        """Lists, tuples, dicts and sets (their subclasses with their class); None for others."""
        get = ENCODERS.get  # atomic items inline: a dict of 100,000 labels is common
        if isinstance(obj, (list, tuple)):
            items = [e(v) if (e := get(type(v))) else self._item(v, f"{path}[{i}]")
                     for i, v in enumerate(obj)]
        elif isinstance(obj, (dict, types.MappingProxyType)):
            items = []
            for k, v in obj.items():
                e, f = get(type(k)), get(type(v))
                items.append(e(k) if e else self._item(k, path))
                items.append(f(v) if f else self._item(v, f"{path}[{k!r}]"))
        elif isinstance(obj, (set, frozenset)):
            items = sorted(e(v) if (e := get(type(v))) else self._item(v, path) for v in obj)
        else:
            return None
        self._spend(sys.getsizeof(obj) + sum(map(len, items)), path)
        kind = type(obj)
        if kind in (list, tuple, dict, set, frozenset):
            return digest(kind.__name__.encode(), *items)
        extra = [self.value(obj.default_factory, f"{path} -> default_factory")] \
            if isinstance(obj, collections.defaultdict) else []
        if isinstance(getattr(obj, "__dict__", None), dict):
            extra += self._named(_attributes(obj) or {}, path)
        own = self.value(kind, f"{path} -> class {kind.__qualname__}")
        return digest(b"subclass", own, *items, *extra)

    def _instance(self, obj: Any, path: str) -> bytes:
        cls: type = type(obj)
        own = self.value(cls, f"{path} -> class {cls.__qualname__}")
        if isinstance(obj, self._sync):  # a lock, a queue, an executor: by its type
            d = digest(b"by type", own)
        else:
            d = digest(b"instance", own, *self._state(obj, path))
        self._record(path, "user" if is_user_class(cls) else "library", d)
        return d

    def _named(self, fields: dict[str, Any], path: str) -> list[bytes]:
        """Attributes, each a component of its own unless it is an empty container."""
        return [p for name in sorted(fields) for p in (name.encode(), self.value(
            fields[name], f"{path} -> .{name}", named=not _empty(fields[name])))]

    def _state(self, obj: Any, path: str) -> list[bytes]:
        """``obj``'s state: its reduction (a library's), ``__getstate__``, or its fields."""
        cls: type = type(obj)
        fields = _attributes(obj)
        if fields is not None and "__wrapped__" in fields:  # functools.cache, a wraps() wrapper
            return self._named(fields, path)
        kind = state_kind(cls, is_user_class)
        if kind == "reduce":
            return self._reduced(obj, path, fields)
        if kind == "getstate":
            try:
                state = obj.__getstate__()
            except Exception as exc:
                raise self.refuse(path, obj, f"an object whose state cannot be read ({exc})") \
                    from None
            if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
                return [self.value(state, f"{path} -> state", named=True)]
            fields = {k: v for k, v in state.items() if k not in METADATA}  # as attributes
        elif fields is None or _hidden_state(cls):  # what pickle reads of it
            return self._reduced(obj, path, None)
        if isinstance(obj, BatchLoader):
            fields = {k: v for k, v in fields.items() if k not in EXECUTION_SETTINGS}
        return self._named(fields, path)

    def _reduced(self, obj: Any, path: str, fallback: dict[str, Any] | None) -> list[bytes]:
        """``obj`` by its pickle reduction; its ``fallback`` fields if it has none."""
        reducer = copyreg.dispatch_table.get(type(obj))
        try:
            reduced: Any = reducer(obj) if reducer is not None else obj.__reduce_ex__(4)
        except Exception as exc:
            if fallback is not None:
                return self._named(fallback, path)
            raise self.refuse(path, obj, "an object of an extension type without state that "
                              "Python can read (no __dict__, slots or pickle support: "
                              f"{exc})") from None
        if isinstance(reduced, str):  # pickled by reference: a library's global
            module = getattr(obj, "__module__", None)
            user = not isinstance(module, str) or module not in sys.modules or is_user_module(
                sys.modules[module])
            return [self._library_name(f"{type(obj).__module__ if user else module}.{reduced}",
                                       path)]
        parts = [list(v) if hasattr(v, "__next__") else v for v in tuple(reduced or ())]
        return [self.value(tuple(parts), f"{path} -> reduced")]
