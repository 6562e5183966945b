"""Zero copy, measured: what N reader processes of one store hold of it, and a fresh reader.

A store of 2,000 vectors of shape ``(3, 64, 64)`` float32 (94 MiB) is read in full by
four processes at once (:func:`run_readers`). Each reports its unique set size (USS: the
memory only it holds, from ``/proc/<pid>/smaps``) before and after touching every vector
while all four still hold their views, and the bytes of the store's mappings it holds alone.
A control run copies the store into each process instead. A fresh process
(:func:`fresh_reader`) reports what opening the store, reading one vector and gathering a
batch add to its anonymous memory and to the resident pages of the store's files.

``tests/test_guarantees/test_shared_memory.py`` runs these measurements and bounds them;
:mod:`benchmarks.guarantees` records their figures.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import tensorstore_cache as tsc

__all__ = ["ITEM", "N", "READERS", "build", "fresh_reader", "noise", "run_readers"]

CHECKOUT = Path(__file__).resolve().parents[2]
N = 2000
ITEM = (3, 64, 64)
READERS = 4
GUARD_S = 180  # a guard against hangs, not a timing


def noise(key: str) -> np.ndarray:
    """A random but reproducible vector per key (cheap: no image decoding)."""
    rng = np.random.default_rng(int(key[1:]))
    return rng.standard_normal(ITEM, dtype=np.float32)


def build(root: Path) -> int:
    """Build the store of :data:`N` :func:`noise` vectors at ``root``; its bytes of vectors."""
    with tsc.build_store([f"k{i}" for i in range(N)], root, loader=noise, loader_id="noise/1",
                         workers=1, progress=False, identity="none") as store:
        return N * store.spec.item_nbytes


def _uss() -> int:
    return int(psutil.Process().memory_full_info().uss)


def _store_private(root: str) -> int:
    """Bytes of the store's mappings held by this process alone (smaps Private_*).

    Zero when every page of the store this process maps is shared with another process
    (the page cache) and none was copied on write.
    """
    total = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = len(head) >= 6 and head[5].startswith(root)
            elif inside and head[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(head[1]) * 1024
    return total


def _touch_everything(store: tsc.CacheStore, mode: str) -> tuple[float, Any]:
    """Read every vector; return a checksum and whatever must stay alive while measured."""
    n = len(store)
    if mode == "copy":  # the control: a private copy of the whole store
        keep = np.array(store.take(np.arange(n)))
        store[store.paths[0]].fill(0.0)  # and one vector copied on write (48 KiB)
        return float(keep.sum(dtype=np.float64)), keep
    total = 0.0
    for key in store.paths:  # a view of every vector (the store keeps the pages mapped)
        total += float(store[key].sum(dtype=np.float64))
    out = np.empty((32, *store.shape[1:]), store.dtype)  # a reused batch buffer
    for start in range(0, n, 32):
        rows = np.arange(start, min(start + 32, n))
        total += float(store.take(rows, out=out[: len(rows)]).sum(dtype=np.float64))
    return total, out


def _reader(root: str, mode: str, store: tsc.CacheStore | None, barrier: Any, queue: Any) -> None:
    """One reader process: measure USS, touch everything, wait for all, measure again."""
    try:
        if store is None:  # spawn: open it here
            store = tsc.open_store(root)
        gc.collect()  # a collection later on would count copied-on-write objects as ours
        before = _uss()
        total, keep = _touch_everything(store, mode)
        barrier.wait(timeout=GUARD_S)  # every reader has touched every page
        after = _uss()
        private = _store_private(root)
        queue.put({"pid": os.getpid(), "before": before, "after": after, "total": total,
                   "private": private})
        barrier.wait(timeout=GUARD_S)  # hold the pages until everybody has measured
        del keep
    except BaseException as exc:  # report, do not hang the others
        queue.put({"pid": os.getpid(), "error": repr(exc)})
        barrier.abort()
        raise


def run_readers(root: Path, method: str, mode: str) -> list[dict[str, Any]]:
    """:data:`READERS` processes (``spawn`` or ``fork``) reading every vector of ``root``
    at once, through views (``mode="views"``) or into a copy (``"copy"``): each one's USS
    before and after (``before``, ``after``), the store's pages it alone holds
    (``private``) and its checksum (``total``).

    Raises
    ------
    RuntimeError
        If a reader failed.
    """
    ctx: Any = multiprocessing.get_context(method)
    barrier = ctx.Barrier(READERS)
    queue = ctx.Queue()
    store = tsc.open_store(root) if method == "fork" else None  # fork: inherit the mapping
    if method == "fork":  # keep the children's garbage collector off the parent's objects
        gc.collect()
        gc.freeze()
    procs = [ctx.Process(target=_reader, args=(str(root), mode, store, barrier, queue))
             for _ in range(READERS)]
    try:
        for p in procs:
            p.start()
        results = [queue.get(timeout=GUARD_S) for _ in procs]
        for p in procs:
            p.join(timeout=GUARD_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if store is not None:
            store.close()
        gc.unfreeze()
    errors = [r["error"] for r in results if "error" in r]
    if errors or any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a reader failed: {errors} (exit codes {[p.exitcode for p in procs]})")
    return results


FRESH = r"""
import json, re, sys
import numpy as np
import tensorstore_cache as tsc

root = sys.argv[1]

def rss():  # [anonymous RSS, the store's files' RSS in pages, in huge pages], /proc/self/smaps
    anon = store_pages = huge = 0
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping: address perms offset dev inode [path]
            inside = len(head) >= 6 and head[5].startswith(root)
        elif head[0] == "Rss:" and inside:
            store_pages += int(head[1]) * 1024
        elif head[0] == "FilePmdMapped:" and inside:  # page-cache huge pages, mapped whole
            huge += int(head[1]) * 1024
        elif head[0] == "Anonymous:":
            anon += int(head[1]) * 1024
    return [anon, store_pages - huge, huge]

keys = [f"k{i}" for i in range(0, 2000, 31)]
base = rss()
store = tsc.open_store(root)
opened = rss()
v = store["k1234"]
checksum = float(v.sum(dtype=np.float64))
one = rss()
batch = store.take(store.rows(keys))
after_batch = rss()
diff = lambda m: [m[i] - base[i] for i in range(3)]
print(json.dumps({"open": diff(opened), "one": diff(one), "batch": diff(after_batch),
                  "batch_rows": len(keys), "batch_bytes": batch.nbytes, "sum": checksum}))
"""


def fresh_reader(root: Path) -> dict[str, Any]:
    """A fresh process opens ``root``, reads ``k1234``, then gathers 65 vectors: what each
    step added to ``[anonymous memory, resident pages of the store's files, of them mapped
    as huge pages]`` in bytes (``open``, ``one``, ``batch``; the second figure leaves the
    third out), the batch's ``batch_bytes`` and the vector's ``sum``."""
    proc = subprocess.run([sys.executable, "-c", FRESH, str(root)], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=GUARD_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the fresh reader failed: {proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out
