"""Hostile stores of records: bad offsets, shapes and field metadata raise, never crash.

A ragged field's rows are views of one reserved address range whose unmapped
pages would kill the process (SIGSEGV) if a hostile offset pointed there.
Offsets and shapes are checked before any view is made, so every read of a
damaged store raises :class:`~tensorstore_cache.errors.CorruptStoreError`
(and the process lives); ``verify`` names every bad offset. The field list of
the metadata is fuzzed like the rest of it: only the project's errors come out.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of

from ..support._damage import damage_is_named
from ..support._records import BOX_FIELDS, RecordLoader, write_sources
from ..support.strategies import mutated_json

REPO = Path(__file__).resolve().parents[2]
ATTR = "tensorstore_cache"
N = 120


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("records-hostile")
    paths = write_sources(base / "src", N)
    root = base / "r.tsc"
    tsc.build_store(paths, root, loader=RecordLoader(boxes=True), loader_id="records/1",
                    fields=BOX_FIELDS, workers=1, progress=False).close()
    return root


@pytest.fixture
def store_copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "r.tsc"
    shutil.copytree(pristine, root)
    return root


def _write_words(path: Path, at: int, words: list[int], dtype: str) -> None:
    """Overwrite array elements ``at``... of a raw file in place, keeping its size."""
    data = bytearray(path.read_bytes())
    item = np.dtype(dtype).itemsize
    junk = np.array(words, dtype=dtype).tobytes()
    start = (at * item) % len(data)
    data[start : start + len(junk)] = junk[: len(data) - start]
    path.write_bytes(bytes(data))


EXERCISE = r"""
import sys, json, numpy as np, tensorstore_cache as tsc
from tensorstore_cache.reader import view_of
out = {}
try:
    store = tsc.open_store(sys.argv[1])
    n = len(store)
    for name in ("title_ids", "boxes", "pic", "title"):
        f = store.field(name)
        for row in range(n):
            view_of(f).vector(row)
        f.take(np.arange(n))
    store.take(np.arange(n))
    out["read"] = "ok"
except tsc.TensorStoreCacheError as exc:
    out["read"] = type(exc).__name__
try:
    out["verify"] = tsc.verify_store(sys.argv[1]).ok
except tsc.TensorStoreCacheError as exc:
    out["verify"] = type(exc).__name__
print(json.dumps(out))
"""


def exercise(root: Path) -> dict[str, Any]:
    """Read every row of every ragged field in a fresh process; it must not die."""
    proc = subprocess.run([sys.executable, "-c", EXERCISE, str(root)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, f"the reader died ({proc.returncode}): {proc.stderr[-2000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("rel", "at", "words", "dtype"),
    [
        ("fields/title_ids/offsets/c/0", 5, [2**40], "<u8"),  # far past the values
        ("fields/title_ids/offsets/c/0", 5, [2**64 - 8], "<u8"),  # wraps around
        ("fields/title_ids/offsets/c/0", 7, [3], "<u8"),  # decreasing
        ("fields/title/offsets/c/0", 3, [10**9], "<u8"),
        ("fields/boxes/offsets/c/0", 50, [2**63], "<u8"),
        ("fields/pic/offsets/c/0", 9, [2**33], "<u8"),
        ("fields/pic/shapes/c/0/0", 4, [1000, 1000], "<i4"),  # a shape larger than its values
        ("fields/pic/shapes/c/0/0", 6, [-2, 5], "<i4"),  # a negative size
    ],
)
def test_damaged_offsets_and_shapes_raise_never_crash(
    store_copy: Path, rel: str, at: int, words: list[int], dtype: str
) -> None:
    path = store_copy / rel
    _write_words(path, at, words, dtype)
    # the file no longer matches its recorded checksum: verify says so; a reader that
    # trusts sizes only (no checksum on open) must still raise, never map outside
    result = exercise(store_copy)
    assert result["read"] == "CorruptStoreError", result
    assert result["verify"] is False


def test_a_last_offset_that_disagrees_with_the_values_is_refused_at_open(store_copy: Path) -> None:
    doc = json.loads((store_copy / "zarr.json").read_text())
    entry = next(f for f in doc["attributes"][ATTR]["fields"] if f["name"] == "title_ids")
    entry["total"] -= 1  # the metadata claims fewer values than the offsets reach
    (store_copy / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(tsc.CorruptStoreError):
        tsc.open_store(store_copy)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(fields=[]), "fields must be a list"),
        (lambda a: a.update(fields={"a": 1}), "fields must be a list"),
        (lambda a: a["fields"][0].update(name="Image"), "not allowed"),
        (lambda a: a["fields"][0].update(name="vectors"), "reserved"),
        (lambda a: a["fields"][0].update(kind="tensor"), "kind must be"),
        (lambda a: a["fields"][0].update(dtype="object"), "not allowed"),
        (lambda a: a["fields"][0].update(shape=[2**40]), "positive"),
        (lambda a: a["fields"][0].update(rows_per_shard=0), "rows_per_shard"),
        (lambda a: a["fields"][1].update(chunk=0), "chunk"),
        (lambda a: a["fields"][1].update(total=-1), "total"),
        (lambda a: a["fields"][1].update(shape=[4]), "None where a dimension varies"),
        (lambda a: a["fields"].append(copy.deepcopy(a["fields"][0])), "clashes"),
        (lambda a: a["fields"][3].update(dtype="int32"), "text field"),
    ],
)
def test_absurd_field_metadata_is_rejected(store_copy: Path, change: Any, match: str) -> None:
    doc = json.loads((store_copy / "zarr.json").read_text())
    change(doc["attributes"][ATTR])
    (store_copy / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(tsc.CorruptStoreError, match=match):
        tsc.open_store(store_copy)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("records-fuzz") / "r.tsc"
    shutil.copytree(pristine, root)
    yield root


def _read_in_process(root: Path) -> str:
    try:
        with tsc.open_store(root) as store:
            n = len(store)
            store.take(np.arange(n))
            for row in range(0, n, 7):
                view_of(store).vector(row)
        return "ok"
    except tsc.TensorStoreCacheError as exc:
        return type(exc).__name__


@FUZZ
@given(data=st.data())
def test_fuzz_the_field_list(scratch: Path, pristine: Path, data: st.DataObject) -> None:
    path = scratch / "zarr.json"
    saved = path.read_bytes()
    doc = json.loads(saved)
    attrs = doc["attributes"][ATTR]
    attrs["fields"] = data.draw(mutated_json(attrs["fields"], rounds=3))
    path.write_bytes(json.dumps(doc, allow_nan=False).encode("utf-8", "surrogatepass"))
    try:
        _read_in_process(scratch)  # only the project's errors (or none) come out
        damage_is_named(scratch, pristine, "zarr.json")
    finally:
        path.write_bytes(saved)


@settings(FUZZ, max_examples=120)
@given(
    rel=st.sampled_from(["fields/title_ids/offsets/c/0", "fields/pic/offsets/c/0",
                         "fields/boxes/offsets/c/0", "fields/title/offsets/c/0"]),
    at=st.integers(0, N),
    words=st.lists(st.sampled_from([0, 1, 7, 119, 120, 121, 2**31, 2**32, 2**63 - 1, 2**63,
                                    2**64 - 1]) | st.integers(0, 2**64 - 1),
                   min_size=1, max_size=4),
)
def test_fuzz_offsets(scratch: Path, pristine: Path, rel: str, at: int,
                      words: list[int]) -> None:
    path = scratch / rel
    saved = path.read_bytes()
    _write_words(path, at, words, "<u8")
    try:
        # in this process: a bad offset must raise before any view is made (a SIGSEGV here
        # would kill the test run)
        assert _read_in_process(scratch) in ("ok", "CorruptStoreError")
        damage_is_named(scratch, pristine, rel)
    finally:
        path.write_bytes(saved)
