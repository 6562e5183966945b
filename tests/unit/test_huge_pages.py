"""Shards of whole huge pages, laid on a huge page (``writer/layout.py``, ``reader/vmap.py``).

A store of 12 KiB items built by one process in 8 shards of 512 rows (6 MiB each) is mapped
with every shard's slot on a 2 MiB boundary, so the kernel can map the page cache's huge
folios whole; a range under 2 MiB is not padded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tensorstore_cache as tsc
from tensorstore_cache.reader.vmap import VirtualRows

HUGE = 2 << 20


def _item(key: str) -> np.ndarray:
    return np.full((3, 32, 32), int(key[1:]), np.float32)


def test_a_store_of_huge_page_shards_lies_on_huge_pages(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(4_096)]
    with tsc.build_store(keys, tmp_path / "s.tsc", loader=_item, workers=1, progress=False,
                         identity="none") as store:
        s, item = store.spec.rows_per_shard, store.spec.item_nbytes
        assert (s, item) == (512, 12_288)  # 6 MiB: three huge pages
        got = store.take(np.arange(len(keys))[::-1])  # maps every shard
        assert np.array_equal(got[:, 0, 0, 0], np.arange(len(keys), dtype=np.float32)[::-1])
        view = store._view  # where the shards lie is not public
        vrows = view.overlay.segments[0].fixed("vectors")._vrows
        assert vrows is not None
        assert vrows.rows.__array_interface__["data"][0] == vrows.address
        assert [(vrows.address + k * s * item) % HUGE for k in range(8)] == [0] * 8


def test_a_range_under_a_huge_page_is_not_padded() -> None:
    small = VirtualRows(100, (4,), np.dtype(np.float32), 50)
    assert small.length == 4096 and small.rows.shape == (100, 4)
    large = VirtualRows(1_000, (3, 32, 32), np.dtype(np.float32), 512)
    assert large.address % HUGE == 0 and large.rows.shape == (1_000, 3, 32, 32)
