"""What a code object computes, without where it was written.

The parts of a code object that say what it does (its instructions, argument
counts, flags, names, variables and exception table) go into its digest, and
each instruction that loads a constant carries that constant's digest, not
its index in ``co_consts``: a constant no instruction loads (the docstring)
says nothing of what the code does, and adding one does not shift the
others; line numbers, column positions and the file name do not, so
comments, blank lines and moving a function keep its digest. The globals its
bytecode reads are listed with the attribute chain after each
(``utils.resize``, ``cfg.SIZE``), through nested code (lambdas, comprehensions,
inner functions) too.
"""

from __future__ import annotations

import bisect
import dis
import functools
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["CodeReads", "code_parts", "reads", "writes_enclosing"]

# CO_HAS_DOCSTRING (3.14+) says only whether there is a docstring: not what the code does.
_DOC_FLAG = 0x4000000
_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_CELL_WRITES = frozenset({"STORE_DEREF", "DELETE_DEREF"})
_JUMPS = frozenset(dis.hasjrel + dis.hasjabs)
# Instructions whose argument is a name (its index, and flags such as NULL, vary).
_BY_NAME = frozenset(dis.opname[op] for op in dis.hasname)
# Instructions whose argument indexes co_consts (LOAD_CONST, KW_NAMES, RETURN_CONST, ...).
_BY_CONST = frozenset(dis.hasconst)


@dataclass
class CodeReads:
    """The globals a code object (and its nested code) reads and writes."""

    chains: set[tuple[str, ...]] = field(default_factory=set)
    """Each global read with the attribute names loaded after it, e.g. ``("cfg", "SIZE")``."""
    assigned: set[str] = field(default_factory=set)
    """Globals the code assigns itself (``global _MODEL``): named by name only."""


@functools.lru_cache(maxsize=4096)
def _listing(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    """``code``'s instructions without ``EXTENDED_ARG`` and ``CACHE`` (read once per code)."""
    return tuple(i for i in dis.get_instructions(code) if i.opname not in ("EXTENDED_ARG",
                                                                           "CACHE"))


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


def reads(code: types.CodeType) -> CodeReads:
    """The globals ``code`` reads, each with its attribute chain, and those it assigns.

    Examples
    --------
    >>> def f(x):
    ...     return cfg.SIZE + helper(x) + len([math.pi for _ in x])
    >>> sorted(reads(f.__code__).chains)
    [('cfg', 'SIZE'), ('helper',), ('len',), ('math', 'pi')]
    """
    found = CodeReads()
    for co in _nested(code):
        chain: list[str] = []
        for ins in _listing(co):
            if ins.opname in _LOADS:
                if chain:
                    found.chains.add(tuple(chain))
                chain = [str(ins.argval)]
            elif ins.opname in _ATTRS and chain:
                chain.append(str(ins.argval))
            else:
                if chain:
                    found.chains.add(tuple(chain))
                chain = []
                if ins.opname in _STORES:
                    found.assigned.add(str(ins.argval))
        if chain:
            found.chains.add(tuple(chain))
    return found


def writes_enclosing(code: types.CodeType) -> str | None:
    """The name of an enclosing variable ``code`` assigns (``nonlocal``), if any."""
    for ins in _listing(code):
        if ins.opname in _CELL_WRITES and ins.argval in code.co_freevars:
            return str(ins.argval)
    return None


def _instructions(code: types.CodeType, constant: Callable[[int], bytes]) -> bytes:
    """The bytecode as instructions that do not depend on how the code was compiled.

    ``obj.meth(...)`` compiles to ``LOAD_METHOD`` where ``obj`` was not imported
    in the same compilation unit and to ``LOAD_ATTR`` (with a ``NULL`` pushed by
    ``LOAD_GLOBAL``) where it was: IPython compiles each statement of a cell
    apart, a script at once. Both are written as one attribute load of the
    name; jump targets and the exception table as instruction indices (the
    inline caches of the two differ in size, so offsets differ). An
    instruction that refers to a constant carries ``constant(index)``, the
    constant's digest: indices shift when a docstring is added or removed.
    """
    listing = _listing(code)
    index = {ins.offset: n for n, ins in enumerate(listing)}
    offsets = sorted(index)

    def at(offset: int) -> int:
        return index.get(offset, bisect.bisect_left(offsets, offset))

    out: list[str] = []
    for ins in listing:
        name = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if ins.opcode in _JUMPS:
            arg = f"->{at(int(ins.argval))}"
        elif ins.opname in _BY_NAME:
            arg = str(ins.argval)
        elif ins.opcode in _BY_CONST and ins.arg is not None:
            arg = "=" + constant(ins.arg).hex()
        else:
            arg = "" if ins.arg is None else str(ins.arg)
        out.append(f"{name} {arg}")
    for e in getattr(dis.Bytecode(code), "exception_entries", ()):  # not in the stubs
        out.append(f"except {at(e.start)} {at(e.end)} {at(e.target)} {e.depth} {e.lasti}")
    return "\n".join(out).encode()


def code_parts(code: types.CodeType, const: Callable[[object, str], bytes]) -> list[bytes]:
    """The parts of ``code`` that say what it computes, each as bytes.

    ``const(value, label)`` digests one constant (nested code included, so that
    it is normalised recursively: sets sorted, floats exact, types tagged).
    Constants enter only through the instructions that load them, by their
    digest: the function's docstring (which no instruction loads) is left out
    wherever it sits in ``co_consts``, while a string literal the code does
    load (on CPython 3.10/3.11 a comprehension's first constant can be one)
    is kept, as is a literal equal to the docstring.
    """
    digests: dict[int, bytes] = {}

    def constant(index: int) -> bytes:
        if index not in digests:
            digests[index] = const(code.co_consts[index], f"constant {index}")
        return digests[index]

    text = [
        code.co_name, code.co_qualname, " ".join(code.co_names), " ".join(code.co_varnames),
        " ".join(code.co_freevars), " ".join(code.co_cellvars),
    ]
    numbers = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
               code.co_flags & ~_DOC_FLAG)
    parts = [b"code", _instructions(code, constant), repr(numbers).encode()]
    parts.extend(t.encode() + b"\0" for t in text)
    return parts
