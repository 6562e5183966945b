"""A batch of at least ``ALIGN_FROM`` bytes starts on a cache line (``gather.batch_array``),
for a store of tensors and for a fixed field of a store of records; smaller ones are plain
arrays. Either way a batch is a new, writable, C-contiguous array of the rows asked for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.reader.gather import ALIGN_FROM, batch_array

ROW = (3, 32, 32)  # 12 KiB of float32: 86 rows make a batch of ALIGN_FROM


def _row(key: str) -> np.ndarray:
    values = float(key[1:]) + np.arange(3 * 32 * 32).reshape(ROW) / 1e4
    return values.astype(np.float32)


def _tensor_store(tmp_path: Path, n: int) -> Path:
    root = tmp_path / "t.tsc"
    tsc.build_store([f"k{i}" for i in range(n)], root, loader=_row, loader_id="row/1",
                    identity="none", workers=1, progress=False).close()
    return root


@pytest.mark.parametrize("nbytes", [ALIGN_FROM, ALIGN_FROM + 16, 3 << 20, 40 << 20])
def test_a_large_batch_array_starts_on_a_cache_line(nbytes: int) -> None:
    # 40 MiB is above glibc's largest mmap threshold: malloc maps it, 16 bytes past a page
    shape = (nbytes // 4,)
    out = batch_array(shape, np.dtype("float32"))
    assert out.ctypes.data % 64 == 0
    assert out.shape == shape and out.dtype == np.float32
    assert out.flags.c_contiguous and out.flags.writeable
    out[:] = 1.5  # the whole view lies inside its block
    assert float(out.sum(dtype=np.float64)) == 1.5 * len(out)


def test_a_small_batch_array_is_a_plain_array() -> None:
    out = batch_array((ALIGN_FROM // 4 - 1,), np.dtype("float32"))
    assert out.flags.owndata


@pytest.mark.parametrize("rows", [100, 300])
def test_a_large_batch_of_a_tensor_store_is_aligned_and_holds_its_rows(
    tmp_path: Path, rows: int
) -> None:
    root = _tensor_store(tmp_path, 400)
    with tsc.open_store(root) as store:
        idx = np.random.default_rng(rows).choice(len(store), rows, replace=False)
        batch = store.take(idx)
        assert batch.nbytes >= ALIGN_FROM and batch.ctypes.data % 64 == 0
        assert batch.flags.c_contiguous and batch.flags.writeable
        expected = np.stack([_row(f"k{r}") for r in idx.tolist()])  # rows follow the keys
        np.testing.assert_array_equal(batch, expected)
        torch = pytest.importorskip("torch")
        tensor = torch.from_numpy(batch)  # what a loader does with it
        assert tensor.shape == (rows, *ROW) and float(tensor[0, 0, 0, 0]) == float(batch[0, 0, 0, 0])
        batch[:] = 0  # a copy: the store is untouched
        np.testing.assert_array_equal(store.take(idx), expected)


def test_a_small_batch_of_a_tensor_store_is_a_plain_array(tmp_path: Path) -> None:
    with tsc.open_store(_tensor_store(tmp_path, 100)) as store:
        batch = store.take(np.arange(20))
        assert batch.nbytes < ALIGN_FROM and batch.flags.owndata


def test_a_large_batch_of_a_fixed_field_of_records_is_aligned(tmp_path: Path) -> None:
    root = tmp_path / "r.tsc"
    tsc.build_store([f"k{i}" for i in range(200)], root,
                    loader=lambda k: {"img": _row(k), "n": np.int32(k[1:])}, loader_id="rec/1",
                    fields={"img": tsc.Fixed(ROW, "float32"), "n": tsc.Fixed((), "int32")},
                    identity="none", workers=1, progress=False).close()
    with tsc.open_store(root) as store:
        idx = np.arange(199, -1, -1)
        batch = store.take(idx)
        assert batch["img"].ctypes.data % 64 == 0 and batch["n"].flags.owndata
        np.testing.assert_array_equal(batch["n"], idx.astype(np.int32))
        np.testing.assert_array_equal(batch["img"], np.stack([_row(f"k{i}") for i in idx]))
        field = store.field("img").take(idx)
        assert field.ctypes.data % 64 == 0
        np.testing.assert_array_equal(field, batch["img"])
