"""The reader's first read in a fresh process: no heavy module imported, distinct shard ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.reader.keyindex import KeyIndex
from tensorstore_cache.reader.sets import distinct

from ..support._records import build_box_store, number_vector, write_sources

# what a read must not import: numpy.ma (np.unique's first call, about 15 ms), and the
# libraries that only a build, a DataFrame or a DataLoader needs
_HEAVY = ("numpy.ma", "pandas", "torch", "PIL", "zarr")

_READS = """
import json, sys
import numpy as np
import tensorstore_cache as tsc
before = set(sys.modules)
store = tsc.open_store(sys.argv[1])
first = store.take(np.zeros(1, dtype=np.int64))
rows = np.arange(len(store))[::-1].copy()
batch = store.take(rows)
one = store[sys.argv[2]]
if store.records:
    batch["title_ids"].pad(value=0)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _imported_by_reads(root: Path, key: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _READS, str(root), key], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["records", "tensors"])
def test_the_first_reads_of_a_fresh_process_import_no_heavy_module(
    tmp_path: Path, kind: str
) -> None:
    if kind == "records":
        paths, root = build_box_store(tmp_path, 300)  # several data files a field
    else:
        paths = write_sources(tmp_path / "src", 300)
        root = tmp_path / "t.tsc"
        tsc.build_store(paths, root, loader=number_vector, loader_id="vec/1", workers=1,
                        progress=False, shard_bytes=512).close()
    imported = _imported_by_reads(root, paths[3])
    heavy = [m for m in imported if m.split(".")[0] in _HEAVY or m.startswith("numpy.ma")]
    assert heavy == [], f"the first reads imported {heavy}"


@pytest.mark.parametrize("n", [0, 1, 5, 64, 65, 1000])
def test_distinct_is_np_unique(n: int) -> None:
    values = np.random.default_rng(n).integers(0, max(1, n // 3), size=n)
    got = distinct(values)
    assert got == np.unique(values).tolist()
    assert all(type(v) is int for v in got)


@pytest.mark.parametrize("spread", ["uniform", "bunched"])
def test_a_single_lookup_finds_every_key_wherever_its_hash_lies(spread: str) -> None:
    # uniform: each hash near its expected place (the window); bunched: every hash in the
    # lowest 2**-20 of the range, far from it (the whole array is searched)
    n = 5000
    rng = np.random.default_rng(7)
    top = 2**64 if spread == "uniform" else 2**44
    hashes = np.sort(rng.integers(0, top, n, dtype=np.uint64, endpoint=False))
    hashes[10] = hashes[11]  # a collision: both rows found by their bytes
    keys = [f"key-{i}".encode() for i in range(n)]
    order = rng.permutation(n)  # row of the i-th hash
    by_row = [keys[i] for i in np.argsort(order)]
    offsets = np.zeros(n + 1, dtype=np.uint64)
    offsets[1:] = np.cumsum([len(k) for k in by_row])
    index = KeyIndex(Path("/nowhere"), n, hashes, order.astype(np.int64), offsets,
                     np.frombuffer(b"".join(by_row), dtype=np.uint8))
    for i in [*range(0, n, 97), 10, 11, n - 1]:
        assert index.find(keys[i], int(hashes[i])) == int(order[i])
    assert index.find(b"absent", int(hashes[5])) == -1
    assert index.find(b"absent", 2**64 - 1) == -1
    assert index.find(b"absent", 0) == -1
