"""Zero-copy, measured: N reader processes share one copy of the store in RAM.

A store of 2,000 vectors of shape ``(3, 64, 64)`` float32 (98 MB) is read
in full by four processes at once. Each reports its unique set size (USS:
the memory only it holds, from ``/proc/<pid>/smaps``) before and after
touching every vector, while all four still hold their views. Pages of the
mapped store are shared, so the four together grow by a few MB; a control
run that copies the store into each process grows by the store size in
each, which proves the measurement can fail. Both ``spawn`` and ``fork``
readers are measured. A fresh process reading one vector grows its RSS by
well under a megabyte: opening maps, it does not read.
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
import pytest

import tensorstore_cache as tsc

psutil = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[2]
N = 2000
ITEM = (3, 64, 64)
READERS = 4
MB = 1 << 20


def _noise(key: str) -> np.ndarray:
    """A random but reproducible vector per key (cheap: no image decoding)."""
    rng = np.random.default_rng(int(key[1:]))
    return rng.standard_normal(ITEM, dtype=np.float32)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("shared") / "noise.tsc"
    store = tsc.build_store([f"k{i}" for i in range(N)], root, loader=_noise,
                            loader_id="noise/1", workers=1, progress=False, identity="none")
    nbytes = N * store.spec.item_nbytes
    assert nbytes > 90 * MB
    store.close()
    return root, nbytes


def _uss() -> int:
    return int(psutil.Process().memory_full_info().uss)


def _store_private(root: str) -> int:
    """Bytes of the store's mappings held by this process alone (smaps Private_* + Anonymous).

    Zero when every page of the store this process maps is shared with another
    process (the page cache) and none was copied on write.
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
        barrier.wait(timeout=120)  # every reader has touched every page
        after = _uss()
        private = _store_private(root)
        queue.put({"pid": os.getpid(), "before": before, "after": after, "total": total,
                   "private": private})
        barrier.wait(timeout=120)  # hold the pages until everybody has measured
        del keep
    except BaseException as exc:  # report, do not hang the others
        queue.put({"pid": os.getpid(), "error": repr(exc)})
        barrier.abort()
        raise


def _run_readers(root: Path, method: str, mode: str) -> list[dict[str, Any]]:
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
        results = [queue.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if store is not None:
            store.close()
        gc.unfreeze()
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_readers_share_one_copy(big_store: tuple[Path, int], method: str) -> None:
    root, nbytes = big_store
    shared = _run_readers(root, method, "views")
    growth = [r["after"] - r["before"] for r in shared]
    print(f"\n{method}: store {nbytes / MB:.0f} MiB; USS growth of {READERS} readers "
          f"touching every vector through views: {[round(g / MB, 1) for g in growth]} MiB")
    # every reader saw the same data, and holds no page of the store alone
    assert len({r["total"] for r in shared}) == 1
    assert all(r["private"] < 256 * 1024 for r in shared), [r["private"] for r in shared]
    if method == "spawn":
        assert sum(growth) < 0.25 * nbytes
    else:
        # a forked child also copies some of its parent's heap pages when it allocates
        # Python objects (a few MiB, depending on the parent, not on the store)
        assert max(growth) < 0.15 * nbytes

    copied = _run_readers(root, method, "copy")
    copy_growth = [r["after"] - r["before"] for r in copied]
    print(f"{method}: USS growth of {READERS} readers holding a copy: "
          f"{[round(g / MB, 1) for g in copy_growth]} MiB")
    assert all(g > 0.9 * nbytes for g in copy_growth)  # the measure does see copies
    assert all(r["private"] >= 48 * 1024 for r in copied)  # and pages copied on write
    assert sum(growth) < 0.1 * sum(copy_growth)


FRESH = r"""
import json, re, sys
import numpy as np
import tensorstore_cache as tsc

root = sys.argv[1]

def rss():  # [anonymous RSS, RSS of the store's own files], from /proc/self/smaps
    anon = store_pages = 0
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping: address perms offset dev inode [path]
            inside = len(head) >= 6 and head[5].startswith(root)
        elif head[0] == "Rss:" and inside:
            store_pages += int(head[1]) * 1024
        elif head[0] == "Anonymous:":
            anon += int(head[1]) * 1024
    return [anon, store_pages]

keys = [f"k{i}" for i in range(0, 2000, 31)]
base = rss()
store = tsc.open_store(root)
opened = rss()
v = store["k1234"]
checksum = float(v.sum(dtype=np.float64))
one = rss()
batch = store.take(store.rows(keys))
after_batch = rss()
diff = lambda m: [m[0] - base[0], m[1] - base[1]]
print(json.dumps({"open": diff(opened), "one": diff(one), "batch": diff(after_batch),
                  "batch_bytes": batch.nbytes, "sum": checksum}))
"""


def test_a_fresh_process_reads_one_vector_without_reading_the_store(
    big_store: tuple[Path, int],
) -> None:
    root, nbytes = big_store
    proc = subprocess.run([sys.executable, "-c", FRESH, str(root)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    kib = {k: [round(x / 1024) for x in out[k]] for k in ("open", "one", "batch")}
    print(f"\nfresh process, store {nbytes / MB:.0f} MiB; growth of [anonymous memory, "
          "resident pages of the store's files] in KiB: "
          f"after open {kib['open']}, after reading one vector {kib['one']}, after gathering "
          f"{len(range(0, 2000, 31))} vectors ({out['batch_bytes'] / MB:.1f} MiB) {kib['batch']}")
    assert out["sum"] == float(_noise("k1234").sum(dtype=np.float64))
    assert out["open"][1] < 64 * 1024  # opening maps the files, it does not read them
    # one 48 KiB vector and the index pages its lookup needs. Around a fault the kernel
    # maps pages already in the page cache too: up to 64 KiB, or a whole large folio (up
    # to 2 MiB) on kernels that cache files in large folios. That costs no memory (the
    # pages are cached anyway) but shows as resident; the store itself is 94 MiB.
    assert out["one"][1] < 2 * MB + 512 * 1024
    assert out["one"][0] < 1 * MB
    # a batch costs its own copy plus the pages it touched, never the whole store
    anon, store_pages = out["batch"]
    assert anon < out["batch_bytes"] + 2 * MB
    # (65 of 2,000 vectors; large page-cache folios can make each fault map up to 2 MiB)
    assert store_pages < 0.25 * nbytes
