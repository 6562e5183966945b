"""Zero-copy, measured: N reader processes share one copy of the store in RAM.

A store of 2,000 vectors of shape ``(3, 64, 64)`` float32 (94 MiB) is read
in full by four processes at once. Each reports its unique set size (USS:
the memory only it holds, from ``/proc/<pid>/smaps``) before and after
touching every vector, while all four still hold their views. Pages of the
mapped store are shared, so the four together grow by a few MB; a control
run that copies the store into each process grows by the store size in
each, which proves the measurement can fail. Both ``spawn`` and ``fork``
readers are measured. A fresh process reading one vector grows its RSS by
well under a megabyte: opening maps, it does not read. The measurements are
:mod:`benchmarks.guarantees.sharing`'s, whose figures ``python -m
benchmarks.guarantees`` records for the guarantees page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.guarantees.sharing import READERS, build, fresh_reader, noise, run_readers

MB = 1 << 20
#: Linux's huge page with 4 KiB pages (x86-64, arm64).
HUGE = 2 << 20


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("shared") / "noise.tsc"
    nbytes = build(root)
    assert nbytes > 90 * MB
    return root, nbytes


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_readers_share_one_copy(big_store: tuple[Path, int], method: str) -> None:
    root, nbytes = big_store
    shared = run_readers(root, method, "views")
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

    copied = run_readers(root, method, "copy")
    copy_growth = [r["after"] - r["before"] for r in copied]
    print(f"{method}: USS growth of {READERS} readers holding a copy: "
          f"{[round(g / MB, 1) for g in copy_growth]} MiB")
    assert all(g > 0.9 * nbytes for g in copy_growth)  # the measure does see copies
    assert all(r["private"] >= 48 * 1024 for r in copied)  # and pages copied on write
    assert sum(growth) < 0.1 * sum(copy_growth)



def test_a_fresh_process_reads_one_vector_without_reading_the_store(
    big_store: tuple[Path, int],
) -> None:
    root, nbytes = big_store
    out = fresh_reader(root)
    kib = {k: [round(x / 1024) for x in out[k]] for k in ("open", "one", "batch")}
    print(f"\nfresh process, store {nbytes / MB:.0f} MiB; growth of [anonymous memory, "
          "resident pages of the store's files mapped as pages, as huge pages] in KiB: "
          f"after open {kib['open']}, after reading one vector {kib['one']}, after gathering "
          f"{out['batch_rows']} vectors ({out['batch_bytes'] / MB:.1f} MiB) {kib['batch']}")
    assert out["sum"] == float(noise("k1234").sum(dtype=np.float64))
    assert out["open"][1] + out["open"][2] < 64 * 1024  # opening maps the files, reads none
    # one 48 KiB vector and the index pages its lookup needs. Around a fault the kernel
    # maps pages already in the page cache too: up to 64 KiB, or a whole large folio (up
    # to 2 MiB, mapped as one huge page when the shard lies on one) on kernels that cache
    # files in large folios. That costs no memory (the pages are cached anyway) but shows
    # as resident; the store itself is 94 MiB.
    assert out["one"][1] + out["one"][2] < 2 * MB + 512 * 1024
    assert out["one"][0] < 1 * MB
    # a batch costs its own copy plus the pages it touched, never the whole store
    anon, store_pages, huge = out["batch"]
    assert anon < out["batch_bytes"] + 2 * MB
    # (65 of 2,000 vectors; large page-cache folios can make each fault map up to 2 MiB)
    assert store_pages < 0.25 * nbytes
    # a huge page mapped is one the batch (or the vector before it) lies on
    with tsc.open_store(root) as store:
        rows = store.rows([f"k{i}" for i in range(0, 2000, 31)] + ["k1234"])
        s, item = store.spec.rows_per_shard, store.spec.item_nbytes
    lies_on = {(row // s, (row % s * item + edge) // HUGE) for row in rows.tolist()
               for edge in (0, item - 1)}
    assert huge <= len(lies_on) * HUGE
