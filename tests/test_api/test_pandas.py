"""CacheStore.series and CacheStore.stack: every row of a DataFrame gets its own vector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = pytest.importorskip("pandas")

import tensorstore_cache as tsc

from ..conftest import write_images


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


# -- stores of records ----------------------------------------------------------------------


class CoverRecord:
    """A record of a cover: its 32 x 32 pixels, title ids and a title from its file name, and
    a rating (importable by worker processes)."""

    def __call__(self, path: str) -> dict[str, Any]:
        name = Path(path).stem
        number = int(name.rsplit("_", 1)[1])
        return {
            "image": tsc.ImageLoader(size=(32, 32), dtype="uint8")(path),
            "title_ids": np.arange(number, number + number % 7 + 1, dtype=np.int32),
            "rating": np.float32(number / 10),
            "title": f"cover {name}",
        }


FIELDS: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
    "image": tsc.Fixed((3, 32, 32), "uint8"), "title_ids": tsc.Ragged("int32"),
    "rating": tsc.Fixed((), "float32"), "title": tsc.Text()}


def test_frame_of_records_gives_every_row_the_fields_of_its_path(
    ratings: pd.DataFrame, covers: list[str], tmp_path: Path
) -> None:
    store = tsc.build_store(covers, tmp_path / "r.tsc", loader=CoverRecord(), loader_id="cover/1",
                            fields=FIELDS, workers=2, progress=False)
    frame = store.frame(ratings["img_path"])
    assert list(frame.columns) == list(FIELDS) and len(frame) == len(ratings)
    assert frame.index.tolist() == ratings["img_path"].tolist()  # absolute, normalised paths
    assert frame["rating"].dtype == np.float32  # a scalar field: a numeric column
    assert frame["image"].dtype == object and frame["title_ids"].dtype == object
    assert all(isinstance(t, str) for t in frame["title"])  # a text field: a column of str
    loader = CoverRecord()
    for i, path in enumerate(ratings["img_path"]):
        want = loader(path)
        row = frame.iloc[i]
        np.testing.assert_array_equal(row["image"], want["image"])
        np.testing.assert_array_equal(row["title_ids"], want["title_ids"])
        assert row["rating"] == want["rating"] and row["title"] == want["title"]
    first = ratings["img_path"].iloc[0]
    assert np.shares_memory(frame["image"].iloc[0], store[first]["image"])  # views, no copy
    assert np.shares_memory(frame["title_ids"].iloc[0], store[first]["title_ids"])
    only = store.frame(ratings["img_path"], fields=["title", "rating"])
    assert list(only.columns) == ["title", "rating"]
    with pytest.raises(tsc.KeyNotInStoreError):
        store.frame([*covers[:2], "missing.jpg"])


def test_series_of_records_is_aligned_to_the_frame_it_comes_from(
    ratings: pd.DataFrame, covers: list[str], tmp_path: Path
) -> None:
    store = tsc.build_store(covers, tmp_path / "r.tsc", loader=CoverRecord(), loader_id="cover/1",
                            fields=FIELDS, workers=1, progress=False)
    df = ratings.copy()
    df["record"] = store.series(df["img_path"])
    assert df["record"].index.equals(ratings.index)
    loader = CoverRecord()
    for path, record in zip(df["img_path"], df["record"], strict=True):
        assert isinstance(record, tsc.Record) and list(record) == list(FIELDS)
        want = loader(path)
        np.testing.assert_array_equal(record.image, want["image"])
        np.testing.assert_array_equal(record.title_ids, want["title_ids"])
        assert record.title == want["title"]
    repeated = df["img_path"][df["img_path"].duplicated(keep=False)]
    first = repeated.iloc[0]
    same = df["record"][df["img_path"] == first]
    assert len(same) > 1 and all(r is same.iloc[0] for r in same)  # one record per path
    # a field of the store is a store: its series is a column of that field
    titles = store.field("title").series(df["img_path"], name="title")
    assert titles.tolist() == [loader(p)["title"] for p in df["img_path"]]


SCRIPT = """
import json, sys
from pathlib import Path
import pandas as pd
import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of
from tests.test_api.test_pandas import FIELDS, CoverRecord

cache, table = sys.argv[1], sys.argv[2]
df = pd.read_csv(table)
store = tsc.cached(df["img_path"], loader=CoverRecord(), loader_id="cover/1", fields=FIELDS,
                   cache_dir=cache, progress=False)
frame = store.frame(df["img_path"])
print(json.dumps({"titles": frame["title"].tolist(), "ratings": frame["rating"].tolist(),
                  "ids": [v.tolist() for v in frame["title_ids"]],
                  "pixels": int(sum(int(v.sum()) for v in frame["image"])),
                  "parts": len(view_of(store).segments)}))
"""


def test_a_script_caches_records_once_and_frames_them(
    ratings: pd.DataFrame, tmp_path: Path
) -> None:
    script = tmp_path / "frame_records.py"
    script.write_text(SCRIPT)
    table = tmp_path / "ratings.csv"
    ratings.to_csv(table, index=False)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    outs = []
    for _ in range(2):  # the second run finds the cache: the same frame, nothing computed
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), str(table)],
                              capture_output=True, text=True, timeout=180, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    loader = CoverRecord()
    wants = [loader(p) for p in ratings["img_path"]]
    assert outs[0]["titles"] == [w["title"] for w in wants]
    assert outs[0]["ids"] == [w["title_ids"].tolist() for w in wants]
    assert outs[0]["ratings"] == pytest.approx([float(w["rating"]) for w in wants])
    assert outs[0]["pixels"] == sum(int(w["image"].sum()) for w in wants)
    assert outs[0]["parts"] == 1
