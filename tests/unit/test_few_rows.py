"""A take of a few rows is read row by row (``reader.sets.FEW``): the same batch as the
vectorised gather of more rows, the same checks, and bounds found without NumPy reductions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.errors import CorruptStoreError
from tensorstore_cache.reader.sets import FEW, int_bounds

from ..support._records import build_box_store, number_vector, write_sources


@pytest.mark.parametrize("n", [1, 2, 64, 65, 1000])
@pytest.mark.parametrize("dtype", ["int64", "uint64", "int32"])
def test_int_bounds_are_numpys_min_and_max(n: int, dtype: str) -> None:
    info = np.iinfo(dtype)
    values = np.random.default_rng(n).integers(info.min, info.max, size=n, dtype=dtype,
                                               endpoint=True)
    lo, hi = int_bounds(values)
    assert (lo, hi) == (int(values.min()), int(values.max()))
    assert type(lo) is int and type(hi) is int


def _rows(batch: Any, k: int) -> list[Any]:
    """The first ``k`` rows of a batch (an array, a Ragged batch, a list of str, or a dict of
    them), one by one."""
    if isinstance(batch, dict):
        return [{name: value for name, value in zip(batch, row, strict=True)}
                for row in zip(*(_rows(v, k) for v in batch.values()), strict=True)]
    return [batch[i] for i in range(k)]


def _same(a: Any, b: Any) -> None:
    """Two rows of a store (arrays, str, or dicts of them) are equal, dtype and shape too."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        for name in a:
            _same(a[name], b[name])
    elif isinstance(a, str):
        assert a == b
    else:
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype and a.shape == b.shape


def _tensor_store(base: Path) -> Path:
    paths = write_sources(base / "src", 300)
    root = base / "t.tsc"
    tsc.build_store(paths, root, loader=number_vector, loader_id="vec/1", workers=1,
                    progress=False, shard_bytes=512).close()
    return root


@pytest.mark.parametrize("kind", ["records", "tensors"])
def test_a_few_rows_are_the_rows_of_a_larger_batch(tmp_path: Path, kind: str) -> None:
    root = build_box_store(tmp_path, 300)[1] if kind == "records" else _tensor_store(tmp_path)
    rng = np.random.default_rng(0)
    few_batches = [np.array([7]), np.array([299, 0, 299]), rng.integers(0, 300, FEW),
                   np.array([], np.int64), np.array([5, 5], np.uint32)]
    for few in few_batches:
        with tsc.open_store(root) as fresh, tsc.open_store(root) as other:
            # the few rows first, in a fresh store (nothing mapped yet), and among more rows
            got = _rows(fresh.take(few), len(few))
            padding = rng.integers(0, 300, 2 * FEW)
            many = other.take(np.concatenate([few.astype(np.int64), padding]))
            assert len(got) == len(few)
            for row, expected in zip(got, _rows(many, len(few)), strict=True):
                _same(row, expected)
            again = _rows(fresh.take(few), len(few))  # and again, every file mapped
            for row, expected in zip(again, got, strict=True):
                _same(row, expected)


def test_a_few_rows_out_of_range_are_refused_by_the_first_bad_one(tmp_path: Path) -> None:
    root = _tensor_store(tmp_path)
    with tsc.open_store(root) as store:
        with pytest.raises(IndexError, match="row 300 is out of range"):
            store.take(np.array([3, 300, -1]))
        with pytest.raises(IndexError, match="row -1 is out of range"):
            store.take(np.array([3, -1, 300]))
        with pytest.raises(IndexError, match=f"row {2**64 - 1} is out of range"):
            store.take(np.array([2**64 - 1], np.uint64))


@pytest.mark.parametrize("kind", ["records", "tensors"])
def test_a_few_rows_are_checked_and_read_without_a_numpy_reduction(
    tmp_path: Path, kind: str
) -> None:
    # a reduction's first call in a fresh process costs more than a first read of a few rows
    root = build_box_store(tmp_path, 300)[1] if kind == "records" else _tensor_store(tmp_path)
    made: list[str] = []

    def profile(_frame: Any, event: str, arg: Any) -> None:
        if (event == "c_call"
                and getattr(arg, "__name__", "") in {"argmax", "max", "min", "reduce"}
                and isinstance(getattr(arg, "__self__", None), (np.ndarray, np.ufunc))):
            made.append(arg.__name__)

    with tsc.open_store(root) as store:
        for rows in (np.array([7]), np.arange(FEW), np.arange(FEW, dtype=np.int32),
                     np.arange(5 * FEW)):
            sys.setprofile(profile)
            try:
                store.take(rows)
            finally:
                sys.setprofile(None)
            if len(rows) <= FEW:
                assert made == [], (len(rows), made)
            else:  # more rows: their bounds by one argmax (the ufunc machinery's is colder)
                assert made[:1] == ["argmax"], made
            made.clear()


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_a_batch_of_many_rows_out_of_range_is_refused_by_its_first_bad_row(
    tmp_path: Path, dtype: type[np.integer[Any]]
) -> None:
    root = _tensor_store(tmp_path)
    many = np.arange(5 * FEW, dtype=dtype) % 300  # more than 64 rows: checked by NumPy
    bad_rows = [300, 2**31 - 1] + ([-1, -(2**31)] if dtype != np.uint64 else [2**64 - 1])
    if dtype == np.int64:
        bad_rows += [-(2**63), 2**63 - 1]
    with tsc.open_store(root) as store:
        assert len(store.take(many)) == len(many)
        for bad in bad_rows:
            for at in (0, len(many) // 2, len(many) - 1):
                rows = many.copy()
                rows[at] = bad
                with pytest.raises(IndexError, match=f"row {bad} is out of range"):
                    store.take(rows)


@pytest.mark.parametrize("change", [1, -1000, "negated"])
def test_a_few_rows_whose_shape_does_not_hold_their_values_are_refused(
    tmp_path: Path, change: int | str
) -> None:
    _paths, root = build_box_store(tmp_path, 300)
    shapes = root / "fields" / "pic" / "shapes" / "c" / "0" / "0"
    raw = bytearray(shapes.read_bytes())
    sizes = np.frombuffer(raw, "<i4").reshape(300, 2).copy()
    if change == "negated":  # both sizes negative: their product still holds the values
        sizes[10] = -sizes[10]
    else:  # one more row of pixels, or a negative one
        sizes[10, 0] += change
    raw[8 * 10 : 8 * 10 + 8] = sizes[10].astype("<i4").tobytes()
    shapes.write_bytes(bytes(raw))
    with tsc.open_store(root) as store:
        for rows in (np.array([10]), np.arange(10, 10 + 2 * FEW)):  # row by row, and vectorised
            with pytest.raises(CorruptStoreError, match="a row's shape does not hold its values"):
                store.field("pic").take(rows)
        assert store.field("pic").take(np.array([11]))[0].shape[0] == 3  # the others read


def test_a_stored_shape_whose_product_wraps_in_int64_is_refused_by_few_rows_and_many(
    tmp_path: Path,
) -> None:
    # (2**22, 2**21, 2**21) is 2**64 elements: 0 once wrapped, the span of an empty row
    keys = [f"k{i}" for i in range(40)]
    root = tmp_path / "vol.tsc"
    tsc.build_store(keys, root, loader=lambda k: {"vol": np.zeros((int(k[1:]) % 2, 2, 3),
                                                                  np.uint8)},
                    loader_id="vol/1", fields={"vol": tsc.Ragged("uint8", (None, None, None))},
                    identity="none", workers=1, progress=False).close()
    with tsc.open_store(root) as store:
        empty = int(store.rows(["k0"])[0])
    shapes = root / "fields" / "vol" / "shapes" / "c" / "0" / "0"
    raw = bytearray(shapes.read_bytes())
    sizes = np.frombuffer(raw, "<i4").reshape(len(keys), 3)
    assert sizes[empty].tolist() == [0, 2, 3]
    raw[12 * empty : 12 * empty + 12] = np.array([2**22, 2**21, 2**21], "<i4").tobytes()
    shapes.write_bytes(bytes(raw))
    with tsc.open_store(root) as store:
        for rows in (np.array([empty]), np.arange(len(keys))):  # row by row, and vectorised
            with pytest.raises(CorruptStoreError, match="a row's shape does not hold its values"):
                store.field("vol").take(rows)


def test_a_few_rows_with_a_decreasing_offset_are_refused(tmp_path: Path) -> None:
    _paths, root = build_box_store(tmp_path, 300)
    offsets = root / "fields" / "title_ids" / "offsets" / "c" / "0"
    raw = bytearray(offsets.read_bytes())
    values = np.frombuffer(raw, "<u8")
    raw[8 * 11 : 8 * 12] = int(values[10] - 1).to_bytes(8, "little")  # row 10 ends before it starts
    offsets.write_bytes(bytes(raw))
    assert not tsc.verify_store(root).ok  # the store's checksums see it, at verify
    with tsc.open_store(root) as store:
        for rows in (np.array([10]), np.arange(10, 10 + 2 * FEW)):  # row by row, and vectorised
            with pytest.raises(CorruptStoreError, match="an offset decreases or passes the values"):
                store.field("title_ids").take(rows)
