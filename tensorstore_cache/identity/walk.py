"""The walk that digests a loader: by value through the user's code, by name into libraries.

Functions are digested by their code (see :mod:`.code`), defaults, closure
contents and the globals they read, each global with the attribute chain after
it resolved through modules; the user's classes by their members (a class is
the user's when its module is: :func:`.origin.is_user_class`); library
functions, classes and modules by qualified name. Values (containers, arrays,
instances) are digested by :class:`.values.ValueWalk`. A value reached through
a library module (``lib.MODEL``) is digested by its state like any other; one
reached through a standard-library module (``os.environ``, ``sys.stdout``) is
the interpreter's own state and is named by name.
"""

from __future__ import annotations

import builtins
import enum
import functools
import sys
import types
from typing import Any

from ..loaders import BatchLoader
from .code import code_parts, reads, writes_enclosing
from .kinds import METADATA
from .origin import is_stdlib, is_user_class, is_user_file, is_user_module, library_name
from .values import EXECUTION_SETTINGS, ValueWalk, digest

__all__ = ["Walker"]

# Members of a class that say nothing of what it computes (or give where it was written).
_CLASS_NOISE = frozenset({
    "__module__", "__dict__", "__weakref__", "__doc__", "_abc_impl", "__slotnames__",
    "__annotations__", "__firstlineno__", "__static_attributes__", "__annotate_func__",
})
# What an Enum class keeps of its members (given as __members__) and of how it made them.
_ENUM_BOOKKEEPING = frozenset({
    "_member_map_", "_member_names_", "_value2member_map_", "_unhashable_values_",
    "_hashable_values_", "_member_type_", "_value_repr_", "_new_member_", "_use_args_",
    "_generate_next_value_", "__new__",
})
_DESCRIPTORS = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                types.MethodWrapperType, types.ClassMethodDescriptorType,
                types.GetSetDescriptorType, types.MemberDescriptorType)
_SLOTS = (types.GetSetDescriptorType, types.MemberDescriptorType)


def _library_code(value: Any) -> bool:
    """Whether ``value`` is a library's function, class or built-in (named by name)."""
    if isinstance(value, type):
        return not is_user_class(value)
    if isinstance(value, types.FunctionType):
        return not is_user_file(value.__code__.co_filename)
    return isinstance(value, _DESCRIPTORS)


def _edge(label: str, value: Any) -> str:
    wrapped = getattr(value, "__wrapped__", value) if callable(value) else value
    if isinstance(wrapped, types.FunctionType) and is_user_file(wrapped.__code__.co_filename):
        return f"helper {label}"
    if isinstance(value, type):
        return f"class {label}"
    if isinstance(value, types.ModuleType):
        return f"module {label}"
    return f"global {label}"


class Walker(ValueWalk):
    """Digests a loader and what it reads, recording its components."""

    def _dispatch(self, obj: Any, path: str, named: bool) -> bytes:
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
            return super()._dispatch(obj, path, named)
        if named:
            self._record(path, "user", d)
        return d

    def _code(self, code: types.CodeType) -> bytes:
        return digest(*code_parts(code, lambda c, label: self.value(c, label)))

    def function(self, fn: types.FunctionType, path: str) -> bytes:
        """A function: by name from a library, else its code and everything it reads."""
        code = fn.__code__
        user = is_user_file(code.co_filename)
        if not user and "<locals>" not in code.co_qualname:  # wraps() copies __qualname__
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
        attributes = {k: v for k, v in vars(fn).items() if k not in METADATA}
        if attributes:  # a wraps() wrapper's __wrapped__, attributes set on it
            parts.append(self.value(attributes, f"{path} -> attributes"))
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
                if isinstance(value, types.ModuleType) or is_user_module(module):
                    library = None
                elif _library_code(value) or is_stdlib(module.__name__):
                    library = f"{module.__name__}.{chain[used - 1]}"
            label = ".".join(chain[:used])
            if label in seen:
                continue
            sub = f"{path} -> {_edge(label, value)}"
            seen[label] = (self._library_name(library, sub) if library is not None
                           else self.value(value, sub, named=True))
        return [part for label in sorted(seen) for part in (label.encode(), seen[label])]

    def _library(self, obj: Any, path: str) -> bytes:
        return self._library_name(library_name(obj), path)

    def _module(self, module: types.ModuleType, path: str) -> bytes:
        if is_user_module(module):
            d = digest(b"user module", module.__name__.encode())
            self._record(path, "user", d)
            return d
        return self._library(module, path)

    def _class(self, cls: type, path: str) -> bytes:
        if not is_user_class(cls):
            return self._library(cls, path)
        own = digest(b"class", cls.__qualname__.encode())
        self._record(path, "user", own)
        parts = [own] + [self.value(b, f"{path} -> base {b.__qualname__}") for b in cls.__bases__]
        if type(cls) is not type:  # a metaclass: EnumType, ABCMeta, the user's own
            parts.append(self.value(type(cls), f"{path} -> metaclass"))
        members = dict(vars(cls))
        skip = EXECUTION_SETTINGS if issubclass(cls, BatchLoader) else frozenset()
        if issubclass(cls, enum.Enum):  # its members, aliases included, by name and value
            skip, members["__members__"] = _ENUM_BOOKKEEPING, dict(cls.__members__)
        for name, member in sorted(members.items()):
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
        if isinstance(obj, _SLOTS) and is_user_class(obj.__objclass__):  # a slot of the user's
            return digest(b"slot", obj.__name__.encode())
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
