"""The memory a method costs the machine while its processes run, sampled.

What a sweep costs the node is the memory of its processes *plus* the page cache of the
method's own files, counted once however many processes map them:

    node = sum of PSS over the processes (the trial processes, their children, helpers
           such as a Manager server), leaving out their mappings of the method's files
         + the resident page-cache bytes of the method's files (``mincore``)

PSS (proportional set size, ``/proc/PID/smaps``) charges each page shared by n processes
1/n to each, so libraries mapped by every process count once in the sum. A method's cache
files are counted by their resident pages instead, which includes pages no process maps
at the moment (a ``torch.save`` file just written or read, a store being built) and counts
pages mapped by several processes once; their share of each process's PSS is taken out so
that no page is counted twice. The source images' page cache is left out: every method
reads the same sources.

Reading ``/proc/PID/smaps`` costs the kernel a walk of the process's page tables (about
20 ms for a process that imported torch), so only processes that map one of the method's
files (seen in the cheap ``/proc/PID/maps``) are read in full; the others give their PSS
through ``/proc/PID/smaps_rollup``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

PAGE = mmap.PAGESIZE
_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = libc
    return _libc


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path`` held in the page cache (``mincore`` over a fresh mapping).

    Mapping a file and asking ``mincore`` reads nothing: the answer does not change the
    page cache. A file that vanishes or cannot be mapped counts 0.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        libc = _c()
        addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            return 0
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return 0
            resident = int(np.count_nonzero(np.frombuffer(memoryview(vec), dtype=np.uint8) & 1))
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
        return min(resident * PAGE, size)
    finally:
        os.close(fd)


def files_under(roots: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Every regular file under ``roots`` (files vanishing meanwhile are skipped)."""
    out: list[str] = []
    for root in roots:
        if os.path.isfile(root):
            out.append(os.fspath(root))
            continue
        for dirpath, _dirs, names in os.walk(root):
            out.extend(os.path.join(dirpath, n) for n in names)
    return out


def _rollup(pid: int) -> dict[str, int]:
    out = {"pss": 0, "anon": 0}
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                out["pss"] = int(line.split()[1]) * 1024
            elif line.startswith(b"Anonymous:"):
                out["anon"] = int(line.split()[1]) * 1024
    return out


def _maps_any(pid: int, roots: tuple[bytes, ...]) -> bool:
    with open(f"/proc/{pid}/maps", "rb") as f:
        data = f.read()
    return any(root in data for root in roots)


# A field's line is found by its newline (the first line of smaps is a mapping's header):
# a literal prefix lets the regex engine skip ahead, nine times faster than ``^`` with
# re.M over the ~400 kB of a process that imported torch.
_PSS = re.compile(rb"\nPss:\s+(\d+) kB")
_ANON = re.compile(rb"\nAnonymous:\s+(\d+) kB")


def _smaps(pid: int, roots: tuple[bytes, ...]) -> dict[str, int]:
    """PSS and anonymous bytes of ``pid``, and the PSS of its mappings of files under roots."""
    with open(f"/proc/{pid}/smaps", "rb") as f:
        data = f.read()
    pss = sum(int(kb) for kb in _PSS.findall(data)) * 1024
    anon = sum(int(kb) for kb in _ANON.findall(data)) * 1024
    cache = 0
    for root in roots:  # a mapping's header line names its file; its "Pss:" line follows
        at = data.find(b" " + root)
        while at >= 0:
            m = _PSS.search(data, at)
            if m is None:
                break
            cache += int(m[1]) * 1024
            at = data.find(b" " + root, m.end())
    return {"pss": pss, "anon": anon, "cache_pss": cache}


def ppid_map() -> dict[int, int]:
    """``{pid: parent pid}`` of every process, from ``/proc/PID/stat``."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        out[int(name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    return out


def process_tree(pids: Iterable[int], parents: dict[int, int] | None = None) -> list[int]:
    """``pids`` and all their living descendants (``parents``: a :func:`ppid_map`)."""
    parents = ppid_map() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = [p for p in pids if p in parents]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return list(dict.fromkeys(out))


class NodeMemory:
    """Samples the node memory of a set of processes and a method's cache files.

    Parameters
    ----------
    cache_roots
        Directories (or files) holding the method's cache; may not exist yet.
    """

    def __init__(self, cache_roots: Iterable[str | os.PathLike[str]] = ()) -> None:
        self.cache_roots = [str(Path(r).resolve()) for r in cache_roots]
        self._roots_b = tuple(os.fsencode(r) for r in self.cache_roots)

    def cache_resident_bytes(self) -> int:
        """Page-cache bytes of every file under the cache roots."""
        return sum(resident_bytes(p) for p in files_under(self.cache_roots))

    def process(self, pid: int) -> dict[str, int] | None:
        """``{"pss", "anon", "cache_pss"}`` of one process, or None if it is gone."""
        try:
            if self._roots_b and _maps_any(pid, self._roots_b):
                return _smaps(pid, self._roots_b)
            mem = _rollup(pid)
        except (OSError, ValueError, IndexError):
            return None
        mem["cache_pss"] = 0
        return mem

    def sample(self, pids: Iterable[int], helpers: Iterable[int] = ()) -> dict[str, Any]:
        """One sample: the processes ``pids`` and their descendants, plus ``helpers``.

        Returns ``node`` (bytes, see the module docstring) with its parts: ``pss`` (sum
        over processes), ``anon``, ``cache_pss`` (their PSS of cache-file mappings,
        already inside ``pss``), ``cache_resident``; ``per_root`` maps each given pid to
        ``{"pss": PSS of its tree, "pids": the tree}`` (for "the process's memory when it
        died", and which children it had).
        """
        per_root: dict[int, dict[str, Any]] = {}
        seen: set[int] = set()
        total = {"pss": 0, "anon": 0, "cache_pss": 0}
        parents = ppid_map()
        groups = [(pid, process_tree([pid], parents)) for pid in pids]
        groups += [(pid, [pid]) for pid in helpers]
        for root, tree in groups:
            sub = 0
            for pid in tree:
                if pid in seen:
                    continue
                seen.add(pid)
                mem = self.process(pid)
                if mem is None:
                    continue
                sub += mem["pss"]
                for key in total:
                    total[key] += mem[key]
            per_root[root] = {"pss": sub, "pids": tree}
        resident = self.cache_resident_bytes() if self.cache_roots else 0
        node = total["pss"] - total["cache_pss"] + resident
        return {"node": node, **total, "cache_resident": resident, "pids": sorted(seen),
                "per_root": per_root}

