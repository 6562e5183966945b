"""Damaged stores: every kind of damage is named, and no reader dies or reads zeros.

A pristine store is copied and damaged in one way per case (truncated,
extended, flipped, deleted, replaced by a symlink, garbled metadata, extra
files). For each case:

* ``verify_store`` / ``CacheStore.verify`` name the damaged file;
* a reader in a separate process opens the store and looks up every key: it
  either gets the right values or a ``CorruptStoreError`` naming the damaged
  file, never zeros or another row's values, and it never dies of SIGBUS
  (its exit status is checked).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache import verify_store
from tensorstore_cache.format.verify import verify_segment
from tensorstore_cache.reader import view_of

from ..support._stores import layered

REPO = Path(__file__).resolve().parents[2]
N = 150  # three shards of 64, 64 and 22 rows
ITEM = (3, 4, 4)


def _vec(key: str) -> np.ndarray:
    """A vector that is never zero and differs for every key."""
    i = int(key[-8:-4])
    return (np.arange(48, dtype=np.float32).reshape(ITEM) + 1.0) * (i + 1)


def _keys(n: int = N) -> list[str]:
    return [f"src/k{i:04d}.bin" for i in range(n)]


def _sum(i: int) -> float:
    return float(_vec(f"src/k{i:04d}.bin").sum())


def build(path: Path, n: int = N) -> tsc.CacheStore:
    return tsc.build_store(_keys(n), path, loader=_vec, loader_id="vec/1", workers=1,
                           progress=False, identity="none")


def shard(root: Path, k: int) -> Path:
    return root / "vectors" / "c" / str(k) / "0" / "0" / "0"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "s.tsc"
    store = build(root)
    assert store.spec.rows_per_shard == 64 and len(store) == N
    store.close()
    return root


# -- damages ----------------------------------------------------------------------

def _truncate(rel: str, size: Callable[[int], int]) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        p = root / rel
        os.truncate(p, size(p.stat().st_size))
        return p
    return damage


def _flip(rel: str, where: Callable[[int], int]) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        p = root / rel
        with open(p, "r+b") as f:
            at = where(p.stat().st_size)
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x10]))
        return p
    return damage


def _append(root: Path) -> Path:
    p = shard(root, 1)
    with open(p, "ab") as f:
        f.write(b"\0")
    return p


def _delete(rel: str) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        (root / rel).unlink()
        return root / rel
    return damage


def _empty_row_valid_crc(root: Path) -> Path:
    """Mark row 5 of shard 1 as never written, with a correct index checksum."""
    p = shard(root, 1)
    data = bytearray(p.read_bytes())
    index_len = 16 * 64
    start = len(data) - index_len - 4
    index = np.frombuffer(bytes(data[start : start + index_len]), "<u8").reshape(64, 2).copy()
    index[5] = 2**64 - 1
    raw = index.tobytes()
    data[start : start + index_len] = raw
    data[-4:] = google_crc32c.value(raw).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    return p


def _symlink_outside(root: Path) -> Path:
    p = shard(root, 1)
    outside = root.parent / "outside.bin"
    shutil.copyfile(p, outside)
    p.unlink()
    p.symlink_to(outside)
    return p


def _garble_json(rel: str) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        p = root / rel
        text = p.read_bytes()
        p.write_bytes(text[: len(text) // 2])
        return p
    return damage


def _retype_vectors(root: Path) -> Path:
    p = root / "vectors" / "zarr.json"
    doc = json.loads(p.read_text())
    doc["data_type"] = "float64"
    p.write_text(json.dumps(doc))
    return p


def _extra(rel: str) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        (root / rel).write_bytes(b"hello")
        return root / rel
    return damage


def _scramble(rel: str) -> Callable[[Path], Path]:
    """Reverse the 8-byte words of an index array: same size, wrong contents."""
    def damage(root: Path) -> Path:
        p = root / rel
        words = np.frombuffer(p.read_bytes(), "<u8")[::-1].copy()
        p.write_bytes(words.tobytes())
        return p
    return damage


S1 = "vectors/c/1/0/0/0"
SHARD1_ROWS = set(range(64, 128))
# name -> (damage, where it is caught: "open", "read" (rows of shard 1), "lookup"
#          (some keys missing or refused), "silent" (only verify sees it), "extra")
CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "shard truncated to 0": (_truncate(S1, lambda n: 0), "read"),
    "shard truncated to half": (_truncate(S1, lambda n: n // 2), "read"),
    "shard truncated by one byte": (_truncate(S1, lambda n: n - 1), "read"),
    "shard one byte longer": (_append, "read"),
    "shard data byte flipped": (_flip(S1, lambda n: 3 * 192 + 7), "silent"),
    "shard index byte flipped": (_flip(S1, lambda n: n - 100), "read"),
    "shard row marked unwritten": (_empty_row_valid_crc, "read"),
    "shard deleted": (_delete(S1), "read"),
    "shard is a symlink out of the store": (_symlink_outside, "read"),
    "key bytes flipped": (_flip("key_bytes/c/0", lambda n: 100), "lookup"),
    "key offsets scrambled": (_scramble("key_offsets/c/0"), "lookup"),
    "key rows scrambled": (_scramble("key_row/c/0"), "lookup"),
    "source sizes flipped": (_flip("source_size/c/0", lambda n: 9), "silent"),
    "key hash truncated": (_truncate("key_hash/c/0", lambda n: n - 8), "open"),
    "key offsets deleted": (_delete("key_offsets/c/0"), "open"),
    "group metadata deleted": (_delete("zarr.json"), "open"),
    "group metadata garbled": (_garble_json("zarr.json"), "open"),
    "array metadata deleted": (_delete("vectors/zarr.json"), "open"),
    "array metadata retyped": (_retype_vectors, "open"),
    "extra file at the root": (_extra("notes.txt"), "extra"),
    "extra file next to a shard": (_extra("vectors/c/1/0/0/0.bak"), "extra"),
}

READER = r"""
import json, sys
import numpy as np
import tensorstore_cache as tsc
n = int(sys.argv[1])
for root in sys.argv[2:]:
    out = {"root": root, "open": None, "rows": []}
    try:
        store = tsc.open_store(root)
    except tsc.TensorStoreCacheError as e:
        out["open"] = [type(e).__name__, e.path]
        print(json.dumps(out), flush=True)
        continue
    for i in range(n):
        key = f"src/k{i:04d}.bin"
        try:
            view = store.get(key)
            if view is None:
                out["rows"].append(["absent"])
                continue
            batch = store.take(store.rows([key]))
            out["rows"].append(["ok", float(view.sum()), float(batch.sum()), bool(not view.any())])
        except tsc.TensorStoreCacheError as e:
            out["rows"].append([type(e).__name__, e.path])
    try:
        store.take(np.arange(len(store)))
        out["take_all"] = "ok"
    except tsc.TensorStoreCacheError as e:
        out["take_all"] = [type(e).__name__, e.path]
    print(json.dumps(out), flush=True)
"""


def run_reader(roots: list[Path], n: int = N) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(n), *map(str, roots)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    # a reader killed by SIGBUS/SIGSEGV has a negative status; any Python error is 1
    assert proc.returncode == 0, f"reader died with status {proc.returncode}:\n{proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def damaged(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case damaged in its own copy, and one reader process's view of all of them."""
    base = tmp_path_factory.mktemp("damaged")
    cases: dict[str, Any] = {}
    for i, (name, (damage, _)) in enumerate(CASES.items()):
        case_dir = base / f"case{i:02d}"
        case_dir.mkdir()
        root = case_dir / "s.tsc"
        shutil.copytree(pristine, root)
        cases[name] = {"root": root, "bad": damage(root)}
    results = run_reader([c["root"] for c in cases.values()])
    assert len(results) == len(cases)
    for c, res in zip(cases.values(), results, strict=True):
        assert res["root"] == str(c["root"])
        c["reader"] = res
    return cases


def test_pristine_store_verifies(pristine: Path) -> None:
    report = verify_store(pristine)
    assert report.ok, str(report)
    assert report.files_checked == 3 + 1 + 12  # shards, vectors/zarr.json, 6 x (zarr.json, c/0)
    assert report.bytes_checked == sum(
        p.stat().st_size for p in pristine.rglob("*") if p.is_file() and p != pristine / "zarr.json"
    )
    assert "OK" in str(report)
    with tsc.open_store(pristine) as store:
        store.verify()  # no error
    res = run_reader([pristine])[0]
    assert res["open"] is None and res["take_all"] == "ok"
    assert [r[0] for r in res["rows"]] == ["ok"] * N
    assert [r[1] for r in res["rows"]] == [_sum(i) for i in range(N)]


@pytest.mark.parametrize("name", list(CASES))
def test_damage_is_named_and_never_read_as_data(name: str, damaged: dict[str, Any]) -> None:
    case = damaged[name]
    root, bad, res = case["root"], str(case["bad"]), case["reader"]
    where = CASES[name][1]

    # verify names the file, whatever the damage
    report = verify_store(root)
    assert not report.ok
    assert bad in report.bad_files, str(report)
    assert bad in str(report)

    if where == "open":
        assert res["open"] == ["CorruptStoreError", bad]
        with pytest.raises(tsc.CorruptStoreError) as info:
            tsc.open_store(root)
        assert bad in str(info.value) and info.value.path == bad
        return

    assert res["open"] is None
    with tsc.open_store(root) as store, pytest.raises(tsc.CorruptStoreError) as info:
        store.verify()
    assert bad in info.value.files and bad in str(info.value)

    rows = res["rows"]
    for i, row in enumerate(rows):
        if row[0] == "ok":
            assert row[3] is False, f"row {i} read as zeros"
            if where != "silent" or i != 64 + 3:
                assert row[1] == row[2] == _sum(i), f"row {i} has another row's values"
    status = [r[0] for r in rows]
    if where == "read":
        assert all(rows[i] == ["CorruptStoreError", bad] for i in SHARD1_ROWS), rows[64]
        assert all(status[i] == "ok" for i in range(N) if i not in SHARD1_ROWS)
        assert res["take_all"] == ["CorruptStoreError", bad]
    elif where == "lookup":
        assert set(status) <= {"ok", "absent", "CorruptStoreError"}
        assert status.count("ok") < N  # the damage shows up as refused lookups, not data
        refused = [r for r in rows if r[0] == "CorruptStoreError"]
        assert all(r[1] == bad for r in refused)
    elif where == "silent":
        assert status == ["ok"] * N
        if "data byte" in name:  # the one altered row reads altered, until verify
            assert rows[64 + 3][1] != _sum(64 + 3)
    else:  # extra
        assert status == ["ok"] * N and res["take_all"] == "ok"


def test_verify_lists_every_bad_file_at_once(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    shutil.copytree(pristine, root)
    bad = [
        _truncate(S1, lambda n: n // 2)(root),
        _delete("vectors/c/2/0/0/0")(root),
        _flip("key_bytes/c/0", lambda n: 3)(root),
        _extra("stray")(root),
    ]
    (root / "vectors" / "c" / "9").mkdir()  # a directory the store does not have
    os.symlink("/etc", root / "vectors" / "c" / "evil")
    bad += [root / "vectors" / "c" / "9", root / "vectors" / "c" / "evil"]
    report = verify_store(root)
    assert sorted(report.bad_files) == sorted(map(str, bad))
    by_path = {p.path: p.kind for p in report.problems}
    assert by_path[str(bad[0])] == "size" and by_path[str(bad[1])] == "missing"
    assert by_path[str(bad[2])] == "checksum" and by_path[str(bad[3])] == "extra"
    with pytest.raises(tsc.CorruptStoreError) as info:
        report.raise_if_bad()
    err = info.value
    assert sorted(err.files) == sorted(map(str, bad)) and err.path in err.files
    for p in bad:
        assert str(p) in str(err)
    again = pickle.loads(pickle.dumps(err))  # travels between processes intact
    assert again.files == err.files and again.path == err.path and str(again) == str(err)


def test_verify_checks_every_segment_of_a_layered_store(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tsc", tmp_path / "b.tsc"
    build(a, 100).close()
    tsc.build_store(_keys(N)[90:], b, loader=_vec, loader_id="vec/1", workers=1,
                    progress=False, identity="none").close()
    store = layered(a, b)
    segments = list(view_of(store).segments)
    assert len(store) == N
    store.verify()
    report = verify_store(store)
    assert report.ok and report.files_checked == sum(len(s.files) for s in segments) == 29
    assert verify_segment(a).ok and verify_segment(b).ok
    _flip("vectors/c/0/0/0/0", lambda n: 11)(b)
    with pytest.raises(tsc.CorruptStoreError) as info:
        store.verify()
    assert info.value.files == [str(b / "vectors/c/0/0/0/0")]
    assert verify_segment(a).ok


def test_verify_of_nothing_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(tsc.StoreNotFoundError):
        verify_store(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tsc.StoreNotFoundError):
        verify_store(tmp_path / "empty")


def test_verify_reports_broken_metadata_without_raising(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    shutil.copytree(pristine, root)
    (root / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": []}')
    report = verify_store(root)
    assert [p.kind for p in report.problems] == ["metadata"]
    assert report.bad_files == [str(root / "zarr.json")]


PREOPENED = r"""
import json, sys
import numpy as np
import tensorstore_cache as tsc
store = tsc.open_store(sys.argv[1])
first = float(store.take(np.arange(0, 64)).sum())   # shard 0 mapped; shard 1 not yet
print("ready", flush=True)
sys.stdin.readline()                                 # the test damages shard 1 now
try:
    store.take(np.arange(64, 128))
    print(json.dumps(["read", first]), flush=True)
except tsc.CorruptStoreError as e:
    print(json.dumps(["CorruptStoreError", e.path, float(store.take(np.arange(0, 64)).sum())]), flush=True)
"""


def test_damage_after_open_is_caught_when_the_shard_is_first_mapped(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    shutil.copytree(pristine, root)
    proc = subprocess.Popen([sys.executable, "-c", PREOPENED, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        os.truncate(shard(root, 1), 1000)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    status = json.loads(out)
    assert status[:2] == ["CorruptStoreError", str(shard(root, 1))]
    assert status[2] == sum(_sum(i) for i in range(64))  # the mapped shard still reads


def test_verify_is_read_only(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    shutil.copytree(pristine, root)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}
    assert verify_store(root).ok
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}
    assert before == after


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_an_open_store_never_mixes_with_its_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """build_store(overwrite=True) under a reader: old rows or a clear error, never new rows."""
    from tensorstore_cache.fs import renames as _jsonio
    from tensorstore_cache.writer import assemble

    if not exchange:
        monkeypatch.setattr(_jsonio, "_renameat2", None)
    swaps: list[bool] = []  # what the publication did: swapped, or fell back to two renames
    real_exchange = _jsonio.exchange_dirs  # what assemble calls, from where it is defined

    def spy(a: Path, b: Path) -> bool:
        swaps.append(real_exchange(a, b))
        return swaps[-1]

    monkeypatch.setattr(assemble, "exchange_dirs", spy)
    root = tmp_path / "s.tsc"
    build(root)
    old = tsc.open_store(root)
    assert float(old["src/k0070.bin"].sum()) == _sum(70)  # shard 1 mapped, 0 and 2 not yet
    keys = _keys()[::-1]  # same keys, same sizes, every row moved
    tsc.build_store(keys, root, loader=_vec, loader_id="vec/1", workers=1, progress=False,
                    overwrite=True, identity="none").close()
    assert swaps == [True] if exchange and _jsonio._renameat2 is not None else swaps == [False]
    new = tsc.open_store(root)
    assert new.paths == keys and float(new["src/k0005.bin"].sum()) == _sum(5)
    assert float(old["src/k0071.bin"].sum()) == _sum(71)  # the mapped shard still reads
    with pytest.raises(tsc.CorruptStoreError, match="replaced or deleted after this store"):
        old["src/k0005.bin"]
    with pytest.raises(tsc.CorruptStoreError):
        old.verify()  # it checks the directory it opened, which is gone
    new.verify()
    assert [p.name for p in tmp_path.iterdir()] == ["s.tsc"]  # no debris either way
