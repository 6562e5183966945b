"""The walk that digests a loader: by value through the user's code, by name into libraries.

Each value is digested with its type: functions by their code (see
:mod:`.code`), defaults, closure contents and the globals they read; the
user's classes by their members; library functions, classes and modules by
qualified name; instances by their class and their state; numpy arrays and
torch tensors by their full bytes, under a cap. What has no content to name it
by is refused with the path that led to it. Synchronisation objects are named
by their type.
"""

from __future__ import annotations

import builtins
import enum
import functools
import hashlib
import io
import random
import socket
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnnamedLoaderError
from ..loaders import BatchLoader
from .code import code_parts, reads, writes_enclosing
from .origin import is_user_file, is_user_module, library_name

__all__ = ["DEFAULT_CAP", "Component", "Walker", "digest"]

#: Bytes of arrays and tensors a fingerprint reads at most (256 MiB).
DEFAULT_CAP = 256 * 2**20

# Settings of where and how a BatchLoader runs, not of what it computes.
EXECUTION_SETTINGS = frozenset({"batch_size", "devices", "device", "executor"})
# Members of a class that say nothing of what it computes (or give where it was written).
_CLASS_NOISE = frozenset({
    "__module__", "__dict__", "__weakref__", "__doc__", "_abc_impl", "__slotnames__",
    "__annotations__", "__firstlineno__", "__static_attributes__", "__annotate_func__",
})
_LOCKS = (type(threading.Lock()), type(threading.RLock()), threading.Condition,
          threading.Semaphore, threading.Event, threading.Barrier)
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_DESCRIPTORS = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                types.MethodWrapperType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType)
_NP_RANDOM = (np.random.Generator, np.random.RandomState, np.random.BitGenerator)


def digest(*parts: bytes) -> bytes:
    """The BLAKE2b digest (16 bytes) of ``parts``, each length-prefixed."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
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


def _atomic(obj: Any) -> bytes | None:
    t = type(obj)
    if obj is None or obj is Ellipsis or obj is NotImplemented:
        return repr(obj).encode()
    if t is bool or t is int:
        return f"{t.__name__}:{obj}".encode()
    if t is float:
        return b"float:" + float(obj).hex().encode()
    if t is complex:
        return b"complex:" + f"{obj.real.hex()},{obj.imag.hex()}".encode()
    if t is str:
        return b"str:" + str(obj).encode("utf-8", "surrogatepass")
    if t is bytes or t is bytearray:
        return t.__name__.encode() + b":" + bytes(obj)
    return None


def _refusal(obj: Any) -> str | None:
    """Why ``obj`` has no content to name it by, if it has none."""
    torch = sys.modules.get("torch")
    if isinstance(obj, _GENERATORS):
        return "a generator, whose state is where it has got to"
    if isinstance(obj, io.IOBase):
        return "an open file"
    if isinstance(obj, socket.socket):
        return "a socket"
    if isinstance(obj, (random.Random, *_NP_RANDOM)) or (
        torch is not None and isinstance(obj, torch.Generator)
    ):
        return "a random generator, whose state moves with every draw"
    if isinstance(obj, threading.Thread):
        return "a thread"
    if isinstance(obj, (types.FrameType, types.TracebackType)):
        return "a running frame"
    return None


def _find(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name``."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for c in cls.__mro__:
        slots = vars(c).get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else list(slots))
    return sorted({n for n in names if n not in ("__dict__", "__weakref__")})


def _user_class(cls: type) -> bool:
    for member in vars(cls).values():
        fn = getattr(member, "__func__", member)
        if isinstance(fn, types.FunctionType) and not fn.__code__.co_filename.startswith("<"):
            return is_user_file(fn.__code__.co_filename)
    module = sys.modules.get(cls.__module__)
    return module is not None and is_user_module(module)


def _edge(label: str, value: Any) -> str:
    if isinstance(value, types.FunctionType) and is_user_file(value.__code__.co_filename):
        return f"helper {label}"
    if isinstance(value, type):
        return f"class {label}"
    if isinstance(value, types.ModuleType):
        return f"module {label}"
    return f"global {label}"


class Walker:
    """Digests values reachable from a loader, recording its components."""

    def __init__(self, root: str, cap: int = DEFAULT_CAP) -> None:
        self.root = root
        self.cap = cap
        self.nbytes = 0
        self.components: dict[str, Component] = {}
        self.modules: set[str] = set()
        """Top-level names of the library modules it uses (their versions are recorded)."""
        self._memo: dict[int, bytes] = {}
        self._keep: list[Any] = []  # what the memo's ids refer to stays alive
        self._stack: dict[int, int] = {}

    def refuse(self, path: str, obj: Any, why: str) -> UnnamedLoaderError:
        """The error for what has no content to name it by, with the path that led there."""
        where = f"{path} ({library_name(type(obj))})"
        return UnnamedLoaderError(
            f"cached() needs a loader_id for the loader {self.root!r}: it cannot be named by "
            f"what it computes, because {where} is {why}. Pass loader_id='myproject.name/1' "
            "(change it whenever the loader's output changes), or create that object inside "
            "the loader (or in a BatchLoader's setup()) rather than holding it", where)

    def _record(self, path: str, origin: str, d: bytes, nbytes: int = 0) -> None:
        self.components.setdefault(path, Component(path, origin, d.hex(), nbytes))

    def value(self, obj: Any, path: str, named: bool = False) -> bytes:
        """The digest of ``obj`` reached by ``path`` (``named``: a component of its own)."""
        atomic = _atomic(obj)
        if atomic is not None:
            d = digest(atomic)
            if named:
                self._record(path, "user", d)
            return d
        key = id(obj)
        if key in self._stack:
            return digest(b"cycle", str(len(self._stack) - self._stack[key]).encode())
        if key in self._memo:
            return self._memo[key]
        self._stack[key] = len(self._stack)
        try:
            d = self._dispatch(obj, path, named)
        finally:
            del self._stack[key]
        self._memo[key] = d
        self._keep.append(obj)
        return d

    def _dispatch(self, obj: Any, path: str, named: bool) -> bytes:
        why = _refusal(obj)
        if why is not None:
            raise self.refuse(path, obj, why)
        if isinstance(obj, _LOCKS):
            return self._library(type(obj), path)
        if isinstance(obj, types.FunctionType):
            return self.function(obj, path)
        if isinstance(obj, type):
            return self._class(obj, path)
        if isinstance(obj, types.ModuleType):
            return self._module(obj, path)
        if isinstance(obj, types.CodeType):
            return self._code(obj)
        d = self._callable(obj, path)
        if d is None:
            d = self._data(obj, path)
        if d is None:
            d = self._container(obj, path)
        if d is None:
            return self._instance(obj, path)
        if named:
            self._record(path, "user", d)
        return d

    def _code(self, code: types.CodeType) -> bytes:
        return digest(*code_parts(code, lambda c, label: self.value(c, label)))

    def function(self, fn: types.FunctionType, path: str) -> bytes:
        """A function: by name from a library, else its code and everything it reads."""
        code = fn.__code__
        user = is_user_file(code.co_filename)
        if not user and "<locals>" not in fn.__qualname__:
            return self._library(fn, path)
        written = writes_enclosing(code)
        if written is not None:
            raise self.refuse(path, fn, f"code that assigns the enclosing variable {written!r} "
                              "(nonlocal), state that changes as it runs")
        own = self._code(code)
        self._record(path, "user" if user else "library", own)
        parts = [b"function", own]
        if fn.__defaults__:
            parts.append(self.value(fn.__defaults__, f"{path} -> defaults", named=True))
        if fn.__kwdefaults__:
            parts.append(self.value(fn.__kwdefaults__, f"{path} -> keyword defaults", named=True))
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            try:
                content = cell.cell_contents
            except ValueError:
                parts.append(b"empty cell " + name.encode())
                continue
            parts += [name.encode(), self.value(content, f"{path} -> closure {name}", named=True)]
        if vars(fn):
            parts.append(self.value(dict(vars(fn)), f"{path} -> attributes"))
        parts.extend(self._globals(fn, path))
        return digest(*parts)

    def _globals(self, fn: types.FunctionType, path: str) -> list[bytes]:
        found = reads(fn.__code__)
        scope = fn.__globals__
        builtin = scope.get("__builtins__", builtins)
        builtin = vars(builtin) if isinstance(builtin, types.ModuleType) else builtin
        seen: dict[str, bytes] = {}
        for chain in sorted(found.chains):
            head = chain[0]
            if head in found.assigned:
                seen[head] = digest(b"assigned by the loader", head.encode())
                continue
            if head not in scope and head not in builtin:
                seen[head] = digest(b"unbound", head.encode())
                continue
            value = scope[head] if head in scope else builtin[head]
            used, library = 1, None
            while used < len(chain) and isinstance(value, types.ModuleType):
                if not hasattr(value, chain[used]):
                    break
                module, value = value, getattr(value, chain[used])
                used += 1
                if not is_user_module(module) and not isinstance(value, types.ModuleType):
                    library = f"{module.__name__}.{chain[used - 1]}"
            label = ".".join(chain[:used])
            if label in seen:
                continue
            sub = f"{path} -> {_edge(label, value)}"
            seen[label] = (self._library_name(library, sub) if library is not None
                           else self.value(value, sub, named=True))
        return [part for label in sorted(seen) for part in (label.encode(), seen[label])]

    def _library_name(self, name: str, path: str) -> bytes:
        top = name.partition(".")[0]
        if top not in sys.stdlib_module_names:
            self.modules.add(top)
        d = digest(b"library", name.encode())
        self._record(path, "library", d)
        return d

    def _library(self, obj: Any, path: str) -> bytes:
        return self._library_name(library_name(obj), path)

    def _module(self, module: types.ModuleType, path: str) -> bytes:
        if is_user_module(module):
            d = digest(b"user module", module.__name__.encode())
            self._record(path, "user", d)
            return d
        return self._library(module, path)

    def _class(self, cls: type, path: str) -> bytes:
        if not _user_class(cls):
            return self._library(cls, path)
        own = digest(b"class", cls.__qualname__.encode())
        self._record(path, "user", own)
        parts = [own] + [self.value(b, f"{path} -> base {b.__qualname__}") for b in cls.__bases__]
        skip = EXECUTION_SETTINGS if issubclass(cls, BatchLoader) else frozenset()
        for name, member in sorted(vars(cls).items()):
            if name not in _CLASS_NOISE and name not in skip:
                parts += [name.encode(), self.value(member, f"{path}.{name}", named=True)]
        return digest(*parts)

    def _callable(self, obj: Any, path: str) -> bytes | None:
        """Partials, bound methods, descriptors and built-in functions; None for others."""
        if isinstance(obj, functools.partial):
            args = self.value(obj.args, f"{path} -> partial args", named=True)
            kw = self.value(dict(sorted(obj.keywords.items())), f"{path} -> partial keywords",
                            named=True)
            return digest(b"partial", self.value(obj.func, path), args, kw)
        if isinstance(obj, types.MethodType):
            return digest(b"method", self.value(obj.__func__, path),
                          self.value(obj.__self__, f"{path} -> self"))
        if isinstance(obj, (staticmethod, classmethod)):
            return digest(type(obj).__name__.encode(), self.value(obj.__func__, path))
        if isinstance(obj, property):
            return digest(b"property", *(self.value(f, path) for f in (obj.fget, obj.fset,
                                                                       obj.fdel)))
        if isinstance(obj, _DESCRIPTORS):
            owner = getattr(obj, "__self__", None)
            if owner is None or isinstance(owner, (types.ModuleType, type)):
                return self._library(obj, path)
            module = sys.modules.get(type(owner).__module__)
            attr = str(getattr(obj, "__name__", ""))
            if getattr(module, attr, None) is obj:  # random.random, a module's bound method
                return self._library_name(f"{type(owner).__module__}.{attr}", path)
            return digest(b"bound", self._library(obj, path), self.value(owner, f"{path} -> self"))
        return None

    def _data(self, obj: Any, path: str) -> bytes | None:
        """Arrays, tensors and other values of a known layout; None for others."""
        torch = sys.modules.get("torch")
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise self.refuse(path, obj, "an array of Python objects")
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
        if isinstance(obj, enum.Enum):
            return digest(b"enum", self.value(type(obj), path), obj.name.encode())
        if isinstance(obj, memoryview):
            return digest(b"memoryview", obj.tobytes())
        return None

    def _bytes(self, path: str, kind: bytes, dtype: str, shape: tuple[int, ...],
               data: Any) -> bytes:
        self.nbytes += data.nbytes
        if self.nbytes > self.cap:
            raise UnnamedLoaderError(
                f"cached() needs a loader_id for the loader {self.root!r}: its arrays and "
                f"tensors hold more than the fingerprint's cap of {self.cap} bytes ({path} "
                f"takes it to {self.nbytes}). Pass loader_id='myproject.name/1', or raise the "
                "cap (TSC_FINGERPRINT_CAP, or loader_fingerprint(..., cap=))", path)
        h = hashlib.blake2b(digest_size=16)
        h.update(memoryview(data).cast("B"))
        d = digest(kind, dtype.encode(), repr(shape).encode(), h.digest())
        self._record(path, "user", d, int(data.nbytes))
        return d

    def _container(self, obj: Any, path: str) -> bytes | None:
        """Lists, tuples, dicts and sets (their subclasses with their class); None for others."""
        if isinstance(obj, (list, tuple)):
            items = [self.value(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        elif isinstance(obj, (dict, types.MappingProxyType)):
            items = [p for k, v in obj.items()
                     for p in (self.value(k, path), self.value(v, f"{path}[{k!r}]"))]
        elif isinstance(obj, (set, frozenset)):
            items = sorted(self.value(v, path) for v in obj)
        else:
            return None
        kind = type(obj)
        if kind in (list, tuple, dict, set, frozenset):
            return digest(kind.__name__.encode(), *items)
        extra = self._state(obj, path) if hasattr(obj, "__dict__") else []
        return digest(b"subclass", self.value(kind, path), *items, *extra)

    def _instance(self, obj: Any, path: str) -> bytes:
        cls = type(obj)
        user = _user_class(cls)
        own = self.value(cls, f"{path} -> class {cls.__qualname__}" if user else path)
        self._record(path, "user" if user else "library", own)
        return digest(b"instance", own, *self._state(obj, path))

    def _state(self, obj: Any, path: str) -> list[bytes]:
        cls = type(obj)
        if _find(cls, "__getstate__") not in (None, object):
            return [self.value(obj.__getstate__(), f"{path} -> state")]
        fields: dict[str, Any] = {}
        slots = _slot_names(cls)
        if isinstance(getattr(obj, "__dict__", None), dict):
            fields.update(vars(obj))
        fields.update((n, getattr(obj, n)) for n in slots if hasattr(obj, n))
        if not fields and not slots and not hasattr(obj, "__dict__"):
            return self._reduced(obj, path)
        if isinstance(obj, BatchLoader):
            fields = {k: v for k, v in fields.items() if k not in EXECUTION_SETTINGS}
        return [p for name in sorted(fields)
                for p in (name.encode(), self.value(fields[name], f"{path} -> .{name}", True))]

    def _reduced(self, obj: Any, path: str) -> list[bytes]:
        cls = type(obj)
        custom = any(_find(cls, n) not in (None, object) for n in ("__reduce_ex__", "__reduce__"))
        if cls is object:
            return [b"object"]
        if not custom:
            raise self.refuse(path, obj, "an object of an extension type without state that "
                              "Python can read (no __dict__, slots or pickle support)")
        try:
            reduced = obj.__reduce_ex__(4)
        except Exception as exc:
            raise self.refuse(path, obj, f"an object that cannot be reduced ({exc})") from None
        if isinstance(reduced, str):
            return [self._library_name(f"{cls.__module__}.{reduced}", path)]
        parts = [v if not isinstance(v, types.GeneratorType) and not hasattr(v, "__next__")
                 else list(v) for v in reduced]
        return [self.value(tuple(parts), f"{path} -> reduced")]
