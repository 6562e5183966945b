"""Layer 1, fs: safe reads, durable writes, temporary directories, disk usage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from tensorstore_cache import config
from tensorstore_cache.errors import CorruptStoreError
from tensorstore_cache.fs import durable, safe, temp


def test_write_replace_is_atomic_and_reports_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    data = [memoryview(b"abc" * 1000), memoryview(b"tail")]
    assert durable.write_replace(path, data) == (3004, xxhash.xxh3_128_hexdigest(b"abc" * 1000 + b"tail"))
    assert path.read_bytes() == b"abc" * 1000 + b"tail"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_write_replace_failing_midway_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    real = os.write

    def fail_second(fd: int, data: bytes) -> int:
        if fail_second.calls:  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")
        fail_second.calls += 1  # type: ignore[attr-defined]
        return real(fd, data)

    fail_second.calls = 0  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "write", fail_second)  # as the durable module calls it
    with pytest.raises(OSError, match="No space"):
        durable.write_replace(path, [memoryview(b"a"), memoryview(b"b")])
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"], "no .partial file is left"


def test_file_digest_of_a_path_and_of_a_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    want = (100_000, xxhash.xxh3_128_hexdigest(b"x" * 100_000))
    assert durable.file_digest(path) == want
    fd = os.open(path, os.O_RDONLY)
    try:
        os.read(fd, 10)  # wherever the offset is, the whole file is read
        assert durable.file_digest(fd, bytearray(4096)) == want
        os.fstat(fd)  # still open
    finally:
        os.close(fd)


def test_fsync_dirs_flushes_every_directory_up_to_the_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaf = tmp_path / "a" / "b" / "c"
    leaf.mkdir(parents=True)
    seen: list[Path] = []
    monkeypatch.setattr(durable, "fsync_dir", seen.append)
    durable.fsync_dirs(leaf, tmp_path / "a")
    assert seen == [leaf, leaf.parent, tmp_path / "a"]


def test_remove_tree_renames_aside_then_removes(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_bytes(b"1")
    temp.remove_tree(tree)
    assert list(tmp_path.iterdir()) == []
    temp.remove_tree(tree)  # gone already: nothing to do
    (tmp_path / "file").write_bytes(b"1")
    temp.remove_tree(tmp_path / "file", aside=tmp_path / ".aside")
    assert list(tmp_path.iterdir()) == []


def test_disk_usage_counts_files_not_symlink_targets(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"1" * 10)
    (tmp_path / "d" / "b").write_bytes(b"1" * 5)
    big = tmp_path / "big"
    big.write_bytes(b"1" * 1000)
    (tmp_path / "d" / "link").symlink_to(big)
    link_size = os.lstat(tmp_path / "d" / "link").st_size
    assert temp.disk_usage(tmp_path / "d") == 15 + link_size
    assert temp.disk_usage(big) == 1000
    assert temp.disk_usage(tmp_path / "missing") == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59, "59 s"), (90, "1.5 minutes"), (7200, "2.0 hours"), (9 * 86400, "9.0 days")],
)
def test_age_text(seconds: float, text: str) -> None:
    assert temp.age_text(seconds) == text


def test_temp_siblings_of_dead_processes_are_collected(tmp_path: Path) -> None:
    target = tmp_path / "s.tsc"
    mine = temp.temp_sibling(target, config.BUILD_MARK)
    mine.mkdir()
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    host = mine.name.split(config.BUILD_MARK)[1].rsplit("-", 2)[0]
    dead = tmp_path / f".s.tsc{config.BUILD_MARK}{host}-{dead_pid}-abcdef12"
    dead.mkdir()
    temp.collect_temp_siblings(tmp_path, f".s.tsc{config.BUILD_MARK}", 3600.0)
    assert mine.exists() and not dead.exists()


def test_read_json_caps_follow_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a": [1, 2, 3, 4, 5], "b": {"c": {"d": 1}}}))
    assert safe.read_json(path, max_bytes=1 << 10)["a"] == [1, 2, 3, 4, 5]
    monkeypatch.setattr(config, "MAX_VALUES", 3)
    with pytest.raises(CorruptStoreError, match="more than the 3 allowed"):
        safe.read_json(path, max_bytes=1 << 10)
    monkeypatch.setattr(config, "MAX_VALUES", 2_000_000)
    monkeypatch.setattr(config, "MAX_DEPTH", 2)
    with pytest.raises(CorruptStoreError, match="deeper than 2 levels"):
        safe.read_json(path, max_bytes=1 << 10)
    with pytest.raises(CorruptStoreError, match="more than the 10 allowed"):
        safe.read_json(path, max_bytes=10)


def test_open_regular_refuses_a_symlink_inside_the_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (tmp_path / "outside").write_bytes(b"secret")
    (root / "f").symlink_to(tmp_path / "outside")
    with pytest.raises(CorruptStoreError, match="is a symlink"):
        safe.open_regular(root / "f", root)
    with pytest.raises(CorruptStoreError, match="not inside the store"):
        safe.open_regular(tmp_path / "outside", root)
