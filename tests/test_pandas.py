"""CacheStore.series and CacheStore.stack: every row of a DataFrame gets its own vector."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = pytest.importorskip("pandas")

import tensorstore_cache as tsc

from .conftest import write_images


@pytest.fixture
def covers(tmp_path: Path) -> list[str]:
    return write_images(tmp_path / "images", 40, seed=7, gray_every=6)


@pytest.fixture
def ratings(covers: list[str]) -> pd.DataFrame:
    """A ratings table as in the seed: many rows per cover, in no particular order."""
    rng = np.random.default_rng(1)
    n = 300
    df = pd.DataFrame({
        "user_id": rng.integers(0, 50, n),
        "img_path": rng.choice(covers, n),  # duplicated paths
        "rating": rng.integers(1, 11, n),
    })
    df = df.sample(frac=1.0, random_state=3)  # shuffled: the index is out of order
    return df[df["rating"] > 3]  # filtered: the index has holes


def decode(path: str) -> np.ndarray:
    return tsc.ImageLoader(size=(32, 32))(path)


def test_series_gives_every_row_its_own_vector(ratings: pd.DataFrame, tmp_path: Path) -> None:
    # built over the unique paths in *sorted* order, as the seed computed its vectors
    unique = sorted(ratings["img_path"].unique())
    store = tsc.build_store(unique, tmp_path / "covers.tsc", workers=1, progress=False)
    df = ratings.copy()
    df["img_vector"] = store.series(df["img_path"])
    assert df["img_vector"].notna().all()
    for path, vector in zip(df["img_path"], df["img_vector"], strict=True):
        assert vector.shape == (3, 32, 32) and vector.dtype == np.float32
        np.testing.assert_array_equal(vector, decode(path))


def test_the_seed_assignment_fails_this_check(ratings: pd.DataFrame, tmp_path: Path) -> None:
    """The seed assigned vectors computed over sorted paths to unsorted rows."""
    img_vector_df = pd.DataFrame({"img_path": ratings["img_path"].unique()})
    data_box = [decode(p) for p in sorted(img_vector_df["img_path"])]
    img_vector_df["img_vector"] = data_box  # type: ignore[assignment]
    wrong = sum(
        not np.array_equal(v, decode(p))
        for p, v in zip(img_vector_df["img_path"], img_vector_df["img_vector"], strict=True)
    )
    assert wrong > 0  # the check above catches it; store.series does not do this


def test_series_is_aligned_zero_copy_and_named(ratings: pd.DataFrame, tmp_path: Path) -> None:
    store = tsc.build_store(ratings["img_path"], tmp_path / "c.tsc", workers=1, progress=False)
    s = store.series(ratings["img_path"], name="img_vector")
    assert s.dtype == object and s.name == "img_vector"
    assert s.index.equals(ratings.index)
    first = ratings["img_path"].iloc[0]
    assert np.shares_memory(s.iloc[0], store[first])  # a view of the mapped file, no copy
    # repeated paths share one view; any iterable works (then the index is a RangeIndex)
    plain = store.series([first, first])
    assert plain.index.equals(pd.RangeIndex(2)) and plain.iloc[0] is plain.iloc[1]
    empty = store.series(pd.Series([], dtype=object))
    assert len(empty) == 0 and empty.dtype == object


def test_stack_returns_one_array_in_the_given_order(ratings: pd.DataFrame, tmp_path: Path) -> None:
    store = tsc.build_store(ratings["img_path"], tmp_path / "c.tsc", workers=1, progress=False)
    x = store.stack(ratings["img_path"])
    assert x.shape == (len(ratings), 3, 32, 32) and x.flags.c_contiguous
    for i in (0, 5, len(ratings) - 1):
        np.testing.assert_array_equal(x[i], decode(ratings["img_path"].iloc[i]))
    out = np.empty_like(x[:3])
    assert store.stack(ratings["img_path"].iloc[:3], out=out) is out
    np.testing.assert_array_equal(out, x[:3])


def test_missing_paths_are_all_named(ratings: pd.DataFrame, tmp_path: Path) -> None:
    store = tsc.build_store(ratings["img_path"].iloc[:5], tmp_path / "c.tsc", workers=1, progress=False)
    missing = [p for p in ratings["img_path"] if p not in store]  # every row, in order
    with pytest.raises(tsc.KeyNotInStoreError) as info:
        store.series(ratings["img_path"])
    assert info.value.missing == missing
    with pytest.raises(KeyError):
        store.stack(ratings["img_path"])


def test_readme_three_lines(ratings: pd.DataFrame, tmp_path: Path) -> None:
    """The seed's process_img_data, as the README shows it."""
    df = ratings.copy()
    store = tsc.cached(df["img_path"], cache_dir=tmp_path / "cache", size=(32, 32), progress=False)
    df["img_vector"] = store.series(df["img_path"])
    x = store.stack(df["img_path"])
    for i in range(0, len(df), 37):
        np.testing.assert_array_equal(df["img_vector"].iloc[i], decode(df["img_path"].iloc[i]))
        np.testing.assert_array_equal(x[i], df["img_vector"].iloc[i])
