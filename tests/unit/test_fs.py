"""Layer 1, fs: checked opens, strict JSON, durable writes, temporary names, disk usage."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from tensorstore_cache import config
from tensorstore_cache.errors import CorruptStoreError
from tensorstore_cache.fs import Trust, durable, jsonfile, locks, opens, ranges, sizes, temp


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
    assert sizes.disk_usage(tmp_path / "d") == 15 + link_size
    assert sizes.disk_usage(big) == 1000
    assert sizes.disk_usage(tmp_path / "missing") == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59, "59 s"), (90, "1.5 minutes"), (7200, "2.0 hours"), (9 * 86400, "9.0 days")],
)
def test_age_text(seconds: float, text: str) -> None:
    assert sizes.age_text(seconds) == text


def test_temp_siblings_of_dead_processes_are_collected(tmp_path: Path) -> None:
    target = tmp_path / "s.tsc"
    mine = temp.temp_path(target, "build")
    mine.mkdir()
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    host = mine.name.split(".tsc-build-")[1].rsplit("-", 2)[0]
    dead = tmp_path / f".s.tsc.tsc-build-{host}-{dead_pid}-abcdef12"
    dead.mkdir()
    temp.collect_temps(tmp_path, 3600.0, target="s.tsc", kind="build")
    assert mine.exists() and not dead.exists()


def test_read_json_caps_follow_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a": [1, 2, 3, 4, 5], "b": {"c": {"d": 1}}}))
    assert jsonfile.read_json(path, max_bytes=1 << 10)["a"] == [1, 2, 3, 4, 5]
    monkeypatch.setattr(config, "MAX_VALUES", 3)
    with pytest.raises(CorruptStoreError, match="more than the 3 allowed"):
        jsonfile.read_json(path, max_bytes=1 << 10)
    monkeypatch.setattr(config, "MAX_VALUES", 2_000_000)
    monkeypatch.setattr(config, "MAX_DEPTH", 2)
    with pytest.raises(CorruptStoreError, match="deeper than 2 levels"):
        jsonfile.read_json(path, max_bytes=1 << 10)
    with pytest.raises(CorruptStoreError, match="more than the 10 allowed"):
        jsonfile.read_json(path, max_bytes=10)


def test_open_regular_refuses_a_symlink_inside_the_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (tmp_path / "outside").write_bytes(b"secret")
    (root / "f").symlink_to(tmp_path / "outside")
    with pytest.raises(CorruptStoreError, match="is a symlink"):
        opens.open_regular(root / "f", root)
    with pytest.raises(CorruptStoreError, match="not inside the store"):
        opens.open_regular(tmp_path / "outside", root)


def test_depth_ignores_brackets_in_strings_and_walks_escaped_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "MAX_DEPTH", 3)
    path = tmp_path / "m.json"
    for text, ok in [
        ('{"a": "[[[[{{{{", "b": [[1]]}', True),  # brackets in a string are no nesting
        ('{"a": [[[1]]]}', False),
        ('{"a\\"": "[[[[", "b": [[1]]}', True),  # an escaped quote: walked value by value
        ('{"a\\"": "x", "b": [[[1]]]}', False),
        ('{"k": [{}, [], {"x": 1}]}', True),
        ('{"k": [{}, [], {"x": []}]}', False),
    ]:
        path.write_text(text)
        if ok:
            assert jsonfile.read_json(path, max_bytes=1 << 10) == json.loads(text)
        else:
            with pytest.raises(CorruptStoreError, match="deeper than 3 levels"):
                jsonfile.read_json(path, max_bytes=1 << 10)


def test_json_file_is_compares_parsed_json_and_refuses_what_read_json_refuses(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    (root / "a").mkdir(parents=True)
    path = root / "a" / "zarr.json"
    expected = {"shape": [3], "fill_value": 0.0, "codecs": [{"name": "bytes"}]}
    path.write_text(json.dumps(expected, indent=2) + "\n")
    assert jsonfile.json_file_is(path, expected, max_bytes=1 << 10, root=root)
    path.write_text(json.dumps(expected))  # other whitespace, the same document
    assert jsonfile.json_file_is(path, expected, max_bytes=1 << 10, root=root)
    assert not jsonfile.json_file_is(path, {**expected, "shape": [4]}, max_bytes=1 << 10, root=root)
    for bad, match in [('{"shape": [3], "fill_value": NaN}', "constant"),
                       ('{"shape": [3', "not valid metadata JSON"),
                       ('{"shape": [3], "shape": [3]}', "duplicate key")]:
        path.write_text(bad)
        with pytest.raises(CorruptStoreError, match=match):
            jsonfile.json_file_is(path, expected, max_bytes=1 << 10, root=root)
    path.write_bytes(json.dumps(expected).encode("utf-16"))
    with pytest.raises(CorruptStoreError, match="not UTF-8"):
        jsonfile.json_file_is(path, expected, max_bytes=1 << 10, root=root)


def test_a_store_walk_opens_each_directory_once_and_refuses_what_open_regular_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    for rel in ("f/x/c/0/0", "f/x/c/1/0", "f/x/zarr.json", "k/c/0"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode())
    (root / "f" / "link").symlink_to(root / "k")
    opened: list[str] = []
    real = os.open

    def counting(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real(path, flags, *args, **kwargs)

    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    monkeypatch.setattr(os, "open", counting)
    try:
        with opens.StoreWalk(root, root_fd, Trust.explicit(root)) as walk:
            for rel in ("f/x/c/0/0", "f/x/c/1/0", "f/x/zarr.json", "k/c/0"):
                fd, st = opens.open_regular_stat(f"{root}/{rel}", root, walk)
                assert os.read(fd, 100) == rel.encode() and st.st_size == len(rel)
                os.close(fd)
            with pytest.raises(CorruptStoreError, match="through a symlink"):
                opens.open_regular(f"{root}/f/link/c/0", root, walk)
            kept = dict(walk._dirs)
        # f, f/x, f/x/c and k, k/c once each; a numbered directory each time it is crossed
        # ("0": the directory f/x/c/0 and three files)
        assert sorted(kept) == ["f", "f/x", "f/x/c", "k", "k/c"]
        assert opened.count("f") == 1 and opened.count("c") == 2 and opened.count("0") == 4
        assert not walk._dirs and all(_closed(fd) for fd in kept.values())
    finally:
        os.close(root_fd)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


# -- the interface ------------------------------------------------------------------------


def test_the_interface_names_every_export_once_and_lazily() -> None:
    import tensorstore_cache.fs as fs

    assert fs.__all__ == sorted(fs.__all__) and len(set(fs.__all__)) == len(fs.__all__)
    for name in fs.__all__:
        value = getattr(fs, name)
        assert getattr(value, "__module__", "").startswith("tensorstore_cache.fs."), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fs.nope  # type: ignore[attr-defined]  # noqa: B018


# -- one temporary-name scheme ------------------------------------------------------------


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def test_every_temporary_name_is_made_and_read_one_way(tmp_path: Path) -> None:
    target = tmp_path / "s.tsc"
    for kind in ("build", "fetch", "gc", "new"):
        made = temp.temp_path(target, kind)
        assert made.parent == tmp_path and made.name.startswith(f".s.tsc.tsc-{kind}-")
        name = temp.parse_temp(made.name)
        assert name is not None and (name.target, name.kind, name.pid) == ("s.tsc", kind, os.getpid())
        # a temporary name of a temporary entry is made from the first target
        again = temp.parse_temp(temp.temp_path(made, "gc").name)
        assert again is not None and (again.target, again.kind) == ("s.tsc", "gc")
    assert temp.temp_path("parts", "new").parent == Path()  # relative to a directory descriptor
    for plain in ("s.tsc", ".s.tsc", "zarr.json", ".tsc-workers", "0.abc.partial"):
        assert temp.parse_temp(plain) is None
    legacy = temp.parse_temp(".s.tsc.tsc-gc-abcdef12")  # no owner recorded
    assert legacy is not None and legacy.pid is None and legacy.kind == "gc"


def test_a_temporary_entry_is_stale_by_its_owner_then_by_its_age() -> None:
    mine = temp.parse_temp(temp.temp_path("x", "new").name)
    assert mine is not None and mine.owner_alive() and not mine.owner_dead()
    assert not mine.stale(10**9, 0.0)  # a live owner's work is never collected
    host = mine.host
    dead = temp.TempName("x", "new", host, _dead_pid())
    assert dead.owner_dead() and dead.stale(0.0, 3600.0)
    elsewhere = temp.TempName("x", "build", "another_host", os.getpid())
    assert not elsewhere.owner_alive() and not elsewhere.owner_dead()
    assert not elsewhere.stale(60.0, 3600.0) and elsewhere.stale(3601.0, 3600.0)


def test_an_owner_that_ended_but_is_not_reaped_is_dead() -> None:
    # a builder SIGKILLed while its parent has not yet waited for it is a zombie: its pid still
    # answers kill(pid, 0), but its work is over and its entries must be swept at once
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.read(); os._exit(0)"],
                             stdin=subprocess.PIPE)
    try:
        host = temp.parse_temp(temp.temp_path("x", "build").name)
        assert host is not None
        entry = temp.TempName("x", "build", host.host, child.pid)
        assert entry.owner_alive() and not entry.stale(10**9, 0.0)  # running: kept
        assert child.stdin is not None
        child.stdin.close()  # it ends now; nobody waits for it yet
        deadline = 300.0  # a guard against hangs, not a timing assertion
        for _ in range(int(deadline / 0.01)):
            state = Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if state == b"Z":
                break
            time.sleep(0.01)
        else:
            pytest.fail("the child never became a zombie")
        assert entry.owner_dead() and entry.stale(0.0, 3600.0)
    finally:
        child.kill()
        child.wait()
    assert entry.owner_dead()  # reaped: gone


def test_collect_temps_knows_every_kind_and_keeps_live_and_foreign_work(tmp_path: Path) -> None:
    mine = temp.temp_path(tmp_path / "s.tsc", "build")
    host, dead = mine.name.split(".tsc-build-")[1].rsplit("-", 2)[0], _dead_pid()
    left = [tmp_path / f".s.tsc.tsc-{kind}-{host}-{dead}-abcdef12" for kind in ("build", "gc", "new")]
    left.append(tmp_path / f".s.tsc.tsc-fetch-{host}-{dead}-abcdef12")
    other = tmp_path / f".t.tsc.tsc-build-{host}-{dead}-abcdef12"  # another target's
    foreign = tmp_path / f".s.tsc.tsc-new-otherhost-{dead}-abcdef12"  # another host's, recent
    for path in [mine, *left[:2], other, foreign]:
        path.mkdir()
        (path / "f").write_bytes(b"x")
    for path in left[2:]:
        path.write_bytes(b"x")  # files too: a file being written, a shard download
    removed = temp.collect_temps(tmp_path, 3600.0, target="s.tsc")
    assert sorted(removed) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name, foreign.name])
    assert temp.collect_temps(tmp_path, 0.0, target="s.tsc", kind="build") == []  # kind filter
    assert temp.collect_temps(tmp_path, 0.0, target="s.tsc") == [foreign]  # old enough now


def test_remove_temps_removes_every_temporary_file_whoever_wrote_it(tmp_path: Path) -> None:
    shard = tmp_path / "vectors" / "c" / "0"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"done")
    temp.temp_path(shard, "new").write_bytes(b"half")  # this (live) process's
    (shard.parent / f".0.tsc-new-otherhost-{_dead_pid()}-abcdef12").write_bytes(b"half")
    assert temp.remove_temps(tmp_path) == 2
    assert [p.name for p in shard.parent.iterdir()] == ["0"]


def test_delete_tree_renames_aside_to_a_name_the_sweepers_know(tmp_path: Path) -> None:
    doomed = tmp_path / "d"
    doomed.mkdir()
    (doomed / "f").write_bytes(b"x")
    seen: list[str] = []
    real = Path.rename

    def spy(self: Path, target: Any) -> Any:
        seen.append(Path(target).name)
        return real(self, target)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "rename", spy)
        assert temp.delete_tree(doomed) is None
    aside = temp.parse_temp(seen[0])
    assert aside is not None and (aside.target, aside.kind, aside.pid) == ("d", "gc", os.getpid())
    assert list(tmp_path.iterdir()) == []


# -- one rule for locks -------------------------------------------------------------------


def _every_lock(tmp_path: Path) -> dict[str, Any]:
    data = tmp_path / "zarr.json"
    data.write_bytes(b"{}")
    shared = locks.SharedHold(data)
    fd = os.open(data, os.O_RDWR)
    try:
        found = {
            "exclusive": locks.ExclusiveLock(tmp_path / "lock").try_acquire(),
            "exclusive, waiting": locks.ExclusiveLock(tmp_path / "lock2").acquire(),
            "shared": shared.held,
            "is_held": locks.is_held(data),
            "try_exclusive": locks.try_exclusive(data),
            "ranges": ranges.RangeHolds(tmp_path / "v.holds").enabled,
            "try_lock_range": ranges.try_lock_range(fd, 0, 0),
        }
    finally:
        os.close(fd)
        shared.close()
    return found


_NOT_HELD = {
    "exclusive": None, "exclusive, waiting": False, "shared": False, "is_held": None,
    "try_exclusive": (True, None), "ranges": False, "try_lock_range": None,
}


def test_locks_turned_off_take_nothing_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.LOCKS_ENV, "0")
    assert _every_lock(tmp_path) == _NOT_HELD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zarr.json"]


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_filesystem_without_locks_makes_every_lock_not_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def refuse(*_args: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", refuse)
    monkeypatch.setattr(fcntl, "fcntl", refuse)
    assert _every_lock(tmp_path) == _NOT_HELD


def test_a_lock_failing_otherwise_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args: Any) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fcntl, "flock", fail)
    with pytest.raises(OSError, match="Input/output error"):
        locks.ExclusiveLock(tmp_path / "lock").try_acquire()
    assert locks.attempt(lambda: None) is True


def test_locks_work_here_and_conflict_between_descriptors(tmp_path: Path) -> None:
    data = tmp_path / "zarr.json"
    data.write_bytes(b"{}")
    first, second = locks.ExclusiveLock(tmp_path / "lock"), locks.ExclusiveLock(tmp_path / "lock")
    assert first.try_acquire() is True and first.held
    assert second.try_acquire() is False and locks.is_held(tmp_path / "lock") is True
    holder = locks.read_holder(tmp_path / "lock")
    assert holder is not None and holder.pid == os.getpid() and holder.what == "build"
    first.release()
    assert locks.is_held(tmp_path / "lock") is False and second.try_acquire() is True
    second.release()
    hold = locks.SharedHold(data)
    assert hold.held and locks.try_exclusive(data) == (False, None)
    hold.close()
    free, fd = locks.try_exclusive(data)
    assert free and fd is not None
    os.close(fd)


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record the (device, inode) of every descriptor fsynced from now on, then fsync it."""
    synced: list[tuple[int, int]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_fsync_tree_syncs_every_file_and_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    for rel in ("zarr.json", "vectors/zarr.json", "vectors/c/0/0", "vectors/c/1/0", "key_hash/c/0"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * 100)
    (tmp_path / "outside").write_text("not ours")
    (root / "link").symlink_to(tmp_path / "outside")
    synced = _record_fsyncs(monkeypatch)
    durable.fsync_tree(root)
    every = [p for p in [root, *root.rglob("*")] if not p.is_symlink()]
    want = sorted((p.stat().st_dev, p.stat().st_ino) for p in every)
    assert sorted(synced) == want  # each once, side by side; no symbolic link followed
    assert len(want) == 12


def test_fsync_tree_raises_what_a_sync_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        (tmp_path / f"f{i}").write_bytes(b"x")
    bad = os.stat(tmp_path / "f2").st_ino
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == bad:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        durable.fsync_tree(tmp_path)
