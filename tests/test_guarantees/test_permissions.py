"""Who may write the cache: private and shared caches, with real users.

Tests run as root. Other users are real: raw uids/gids given to files with
``os.chown`` (no user entry needed), or users and groups made for the test
with ``useradd``/``groupadd`` where membership matters. Their code runs in
children forked from this process that switch uid and gid (``tests/support/_uids``);
their caches live under a ``0o1777`` directory in ``/tmp``. What is asserted
is what root can observe: owners, modes, refusals and their messages.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc

from ..support import _records, _uids
from ..support._cache_loaders import LogLoader, expected, log_lines, write_sources
from ..support._uids import Accounts, Child, Gate, run_as

pytestmark = pytest.mark.skipif(not _uids.can_switch_users(), reason="needs root and fork")

VICTIM = (64101, 64101, (64101,))
MALLORY = (64102, 64102, (64102,))


@pytest.fixture(scope="module", autouse=True)
def _preloaded() -> None:
    # the children cannot read the interpreter's files (root's home): import everything now
    _uids.preload("tensorstore_cache", skip=("torch",))
    with contextlib.suppress(ImportError):
        import fsspec.implementations.memory  # noqa: F401


@pytest.fixture
def sources(base: Path) -> list[str]:
    keys = write_sources(base / "src", 12)
    os.chmod(base / "src", 0o755)
    log = base / "log"
    log.touch()
    os.chmod(log, 0o666)
    return keys


class EvilLoader(LogLoader):
    """Same loader id and parameters as LogLoader, other vectors: what a planted cache holds."""

    def __call__(self, key: str) -> Any:
        return np.full(4, 666.0, np.float32)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def only_namespace(cache: Path) -> Path:
    (ns,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    return ns


# -- run in the children --------------------------------------------------------------------


def get(cache: str, keys: list[str], log: str, share: str | int | None = None,
        gate: Gate | None = None, identity: str = "stat") -> Any:
    if gate is not None:
        gate.wait()
    with tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), workers=1, progress=False,
                    share_with=share, identity=identity) as store:  # type: ignore[arg-type]
        return np.array(store.take(store.rows(keys)))


def plant(cache: str, keys: list[str], log: str, scale: int = 1) -> None:
    tsc.cached(keys, cache_dir=cache, loader=EvilLoader(log, scale=scale), workers=1,
               progress=False).close()


def cli(*argv: str) -> tuple[int, str, str]:
    from tensorstore_cache.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def my_pid_calls(log: str) -> int:
    return sum(1 for pid, _k in log_lines(Path(log)) if pid == os.getpid())


# -- private caches -------------------------------------------------------------------------


def test_namespace_planted_by_another_uid_is_refused_not_read(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    victim_cache, mallory_cache = base / "victim", base / "mallory"
    run_as(MALLORY, plant, str(mallory_cache), sources, log)
    # the victim's cache exists (its own), and a namespace of Mallory's appears in it
    run_as(VICTIM, get, str(victim_cache), sources[:1], log)
    shutil.rmtree(only_namespace(victim_cache))
    planted = only_namespace(mallory_cache)
    planted.rename(victim_cache / planted.name)
    calls_before = len(log_lines(Path(log)))
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, get, str(victim_cache), sources, log)
    err = info.value
    assert isinstance(err, PermissionError)
    assert err.path == str(victim_cache / planted.name) and err.uid == MALLORY[0]
    msg = str(err)
    assert "uid 64102" in msg and "drwx------" in msg and "cache_dir" in msg
    assert len(log_lines(Path(log))) == calls_before, "nothing computed, nothing returned"
    # refused before anything in it is read: even a namespace.json that is not JSON
    (victim_cache / planted.name / "namespace.json").write_text("{not json")
    with pytest.raises(tsc.UntrustedCacheError):
        run_as(VICTIM, get, str(victim_cache), sources, log)
    # removed, the victim's own vectors are computed and used
    shutil.rmtree(victim_cache / planted.name)
    got = run_as(VICTIM, get, str(victim_cache), sources, log)
    np.testing.assert_array_equal(got, expected(sources))


def test_cache_root_of_another_user_is_refused(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    common = base / "common"
    run_as(MALLORY, plant, str(common), sources, log)
    os.chmod(common, 0o777)  # "everyone may use it"
    with pytest.raises(tsc.UntrustedCacheError, match="uid 64102") as info:
        run_as(VICTIM, get, str(common), sources, log)
    assert info.value.path == str(common)


def test_part_or_file_of_another_uid_is_refused(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    cache = base / "victim"
    run_as(VICTIM, get, str(cache), sources, log)
    (part,) = [p for p in (only_namespace(cache) / "parts").iterdir() if p.is_dir()]
    os.chown(part, *MALLORY[:2])
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, get, str(cache), sources, log)
    assert info.value.path == str(part)
    os.chown(part, *VICTIM[:2])
    shard = next(p for p in (part / "vectors").rglob("*") if p.is_file() and p.name != "zarr.json")
    os.chown(shard, *MALLORY[:2])
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, get, str(cache), sources, log)
    assert info.value.path == str(shard)


def test_group_writable_part_is_refused_outside_shared_mode(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    cache = base / "victim"
    run_as(VICTIM, get, str(cache), sources, log)
    ns = only_namespace(cache)
    (part,) = [p for p in (ns / "parts").iterdir() if p.is_dir()]
    os.chmod(part, 0o770)
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, get, str(cache), sources, log)
    msg = str(info.value)
    assert info.value.path == str(part)
    assert f"chmod go-w {part}" in msg and "share_with=" in msg and "drwxrwx---" in msg
    os.chmod(part, 0o700)
    index = part / "key_hash" / "c" / "0"
    os.chmod(index, 0o664)
    with pytest.raises(tsc.UntrustedCacheError, match="chmod go-w"):
        run_as(VICTIM, get, str(cache), sources, log)
    os.chmod(index, 0o600)
    np.testing.assert_array_equal(run_as(VICTIM, get, str(cache), sources, log), expected(sources))


def test_private_modes_and_a_sticky_parent(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    cache = base / "victim"  # base is 0o1777, as /tmp
    got = run_as(VICTIM, get, str(cache), sources, log, umask=0o002)
    np.testing.assert_array_equal(got, expected(sources))
    for p in [cache, *cache.rglob("*")]:
        want = 0o700 if p.is_dir() else 0o600
        assert mode(p) == want, p
        assert p.lstat().st_uid == VICTIM[0]
    # without the sticky bit anyone could swap the cache: refused, with the fix
    loose = base / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, get, str(loose / "cache"), sources, log)
    assert f"chmod +t {loose}" in str(info.value)


def test_explicit_path_opens_with_one_warning(base: Path, sources: list[str]) -> None:
    log = str(base / "log")
    cache = base / "victim"
    run_as(VICTIM, get, str(cache), sources, log)
    ns = only_namespace(cache)
    os.chmod(ns, 0o775)

    def open_three_times(path: str) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                tsc.open_store(path).close()
        return [f"{w.category.__name__}: {w.message}" for w in seen]

    # cached() refuses it; the same directory named by its path opens, with one warning
    with pytest.raises(tsc.UntrustedCacheError):
        run_as(VICTIM, get, str(cache), sources, log)
    seen = run_as(VICTIM, open_three_times, str(ns))
    assert len(seen) == 1 and seen[0].startswith("StorePermissionWarning")
    assert str(ns) in seen[0] and "\n" not in seen[0]


def test_remote_copy_planted_is_refused(base: Path, sources: list[str]) -> None:
    pytest.importorskip("fsspec")
    url = f"memory://tsc-perm-{os.getpid()}/store.tsc"
    tsc.build_store(sources, url, cache_dir=base / "root-cache", loader=LogLoader(base / "log"),
                    workers=1, progress=False).close()
    cache = base / "victim"

    def read(url: str, cache: str) -> int:
        with tsc.open_store(url, cache_dir=cache) as store:
            return len(store)

    assert run_as(VICTIM, read, url, str(cache)) == len(sources)
    version = next(p for p in (cache / "remote").rglob("*") if p.is_dir() and (p / "zarr.json").exists())
    assert mode(version) == 0o700 and mode(version / "zarr.json") == 0o600
    os.chown(version, *MALLORY[:2])
    with pytest.raises(tsc.UntrustedCacheError) as info:
        run_as(VICTIM, read, url, str(cache))
    assert info.value.path == str(version)


# -- ls and gc ------------------------------------------------------------------------------


def _victim_and_planted(base: Path, sources: list[str]) -> tuple[Path, Path, Path]:
    """The victim's cache with its own namespace and one of Mallory's (another loader scale)."""
    log = str(base / "log")
    cache = base / "victim"
    run_as(VICTIM, get, str(cache), sources, log)
    (mine,) = list(cache.iterdir())
    run_as(MALLORY, plant, str(base / "m"), sources[:3], log, 2)
    other = only_namespace(base / "m")
    planted = cache / other.name
    other.rename(planted)
    return cache, mine, planted


def test_ls_flags_what_cached_would_refuse(base: Path, sources: list[str]) -> None:
    cache, mine, planted = _victim_and_planted(base, sources)
    code, out, err = run_as(VICTIM, cli, "ls", "--cache-dir", str(cache))
    assert code == 0, err
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln.startswith("tests.")}
    assert set(rows) == {mine.name, planted.name}
    assert "uid 64101:64101" in rows[mine.name] and "drwx------" in rows[mine.name]
    assert "REFUSED" not in rows[mine.name]
    assert "uid 64102:64102" in rows[planted.name]
    assert rows[planted.name].endswith(f"REFUSED: {planted.name}: owned by uid 64102")
    assert "1 cache(s) marked REFUSED would be refused by cached()" in out
    code, out, _ = run_as(VICTIM, cli, "ls", "--cache-dir", str(cache), "--json")
    listed = {c["namespace"]: c for c in json.loads(out)}
    assert listed[mine.name]["refused"] is None and listed[mine.name]["mode"] == "drwx------"
    assert listed[mine.name]["owner"] == "uid 64101"
    assert listed[planted.name]["loader_id"] == "?", "nothing of it was read"
    # its files cannot even be looked at: its directory's time stands for its last use
    used = datetime.fromisoformat(listed[planted.name]["last_used"])
    assert abs((datetime.now(UTC) - used).total_seconds()) < 3600
    assert f"refusing the cache directory {planted}" in listed[planted.name]["refused_message"]
    assert "cache_dir" in listed[planted.name]["refused_message"]
    # a group-writable shard file inside the victim's own namespace: found by the same opens
    (part,) = [p for p in (mine / "parts").iterdir() if p.is_dir()]
    shard = next(p for p in (part / "vectors").rglob("*") if p.is_file() and p.name != "zarr.json")
    os.chmod(shard, 0o660)
    listed = {c["namespace"]: c for c in json.loads(run_as(VICTIM, cli, "ls", "--cache-dir",
                                                             str(cache), "--json")[1])}
    assert listed[mine.name]["refused"] == f"{shard.relative_to(cache)}: writable by group 64101"
    assert f"chmod go-w {shard}" in listed[mine.name]["refused_message"]


def test_gc_keeps_other_users_files_unless_asked(base: Path, sources: list[str]) -> None:
    cache, mine, planted = _victim_and_planted(base, sources)

    def collect(cache: str, all_users: bool) -> list[str]:
        return [r.path for r in tsc.gc(cache, older_than=0, all_users=all_users)]

    code, out, err = run_as(VICTIM, cli, "gc", "--cache-dir", str(cache), "--older-than", "0")
    assert code == 0, err
    assert f"removed namespace {mine} " in out and "removed 1 item(s)" in out
    assert planted.exists() and not mine.exists()
    # what it kept, and why, is said once (on stderr from the command line)
    assert "gc kept 1 item(s) of other users (uid 64102)" in err and "--all-users" in err
    # asked, but the system does not let the victim delete Mallory's files: kept, and said
    code, out, err = run_as(VICTIM, cli, "gc", "--cache-dir", str(cache), "--older-than", "0",
                            "--all-users")
    assert code == 0 and "removed 0 item(s)" in out
    assert "gc could not delete 1 item(s)" in err and str(planted) in err
    assert planted.exists()
    assert run_as(VICTIM, collect, str(cache), True) == []
    # root keeps them too, unless asked
    assert [r.path for r in tsc.gc(cache, older_than=0)] == []
    assert [r.path for r in tsc.gc(cache, older_than=0, all_users=True)] == [str(planted)]
    assert not planted.exists()


# -- shared caches --------------------------------------------------------------------------


def test_two_users_of_a_group_build_once_and_both_read(
    base: Path, sources: list[str], accounts: Accounts
) -> None:
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    log = str(base / "log")
    team = base / "team"
    gate = Gate()
    kids = [
        Child(a, get, str(team), sources, log, group, gate, umask=0o077),
        Child(b, get, str(team), sources, log, gid, gate, umask=0o022),  # by numeric gid
    ]
    try:
        gate.open()
        results = [k.result(120) for k in kids]
    finally:
        gate.close()
        for k in kids:
            k.kill()
    for got in results:
        np.testing.assert_array_equal(got, expected(sources))
    calls = log_lines(Path(log))
    assert sorted(k for _p, k in calls) == sorted(sources), "every item computed once"
    assert len({p for p, _k in calls}) == 1, "by one process"
    # what the shared mode creates
    ns = only_namespace(team)
    member_write = {ns / "lock", ns / "last_used"}
    for p in [team, *team.rglob("*")]:
        st = p.lstat()
        assert st.st_gid == gid, p
        if p.is_dir():
            assert stat.S_IMODE(st.st_mode) == 0o2770, p
        else:
            assert stat.S_IMODE(st.st_mode) == (0o660 if p in member_write else 0o640), p
    # a later call of either is a hit, through TSC_CACHE_GROUP too
    assert run_as(b, get, str(team), sources, log, None, env={"TSC_CACHE_GROUP": group}) is not None
    assert len(log_lines(Path(log))) == len(sources)
    # the same cache without share_with is refused, and says how to use it, to the member
    # who created its directory (group-writable) and to the other one (owned by someone else)
    for user in (a, b):
        with pytest.raises(tsc.UntrustedCacheError, match=f"share_with='{group}'"):
            run_as(user, get, str(team), sources, log)


def test_shared_cache_refuses_files_of_non_members(
    base: Path, sources: list[str], accounts: Accounts
) -> None:
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    outsider = accounts.user()
    log = str(base / "log")
    team = base / "team"
    run_as(a, get, str(team), sources, log, group)
    (part,) = [p for p in (only_namespace(team) / "parts").iterdir() if p.is_dir()]
    os.chown(part, outsider.uid, gid)
    with pytest.raises(tsc.UntrustedCacheError, match="not a member of group") as info:
        run_as(a, get, str(team), sources, log, group)
    assert info.value.path == str(part)
    os.chown(part, a.uid, gid)
    os.chmod(part, 0o2777)
    with pytest.raises(tsc.UntrustedCacheError, match="o-w"):
        run_as(a, get, str(team), sources, log, group)
    with pytest.raises(PermissionError, match="not a member"):
        run_as(outsider, get, str(team), sources, log, group)


def test_shared_gc_keeps_another_members_part_unless_asked(
    base: Path, sources: list[str], accounts: Accounts
) -> None:
    group, _gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    log = str(base / "log")
    team = base / "team"
    run_as(a, get, str(team), sources, log, group)
    parts = only_namespace(team) / "parts"
    (live,) = [p for p in parts.iterdir() if p.is_dir()]

    def orphan(src: str) -> str:  # an unreferenced part of a's, as a merge leaves
        dst = src[:-8] + "0badf00d"
        shutil.copytree(src, dst)
        os.utime(dst, (0, 0))
        return dst

    dead = Path(run_as(a, orphan, str(live)))

    def collect(cache: str, all_users: bool) -> list[str]:
        return [r.path for r in tsc.gc(cache, grace=0, share_with=group, all_users=all_users)]

    assert run_as(b, collect, str(team), False) == []
    assert dead.exists()
    assert run_as(b, collect, str(team), True) == [str(dead)]
    assert not dead.exists() and live.exists()


def test_private_cache_opened_as_shared_says_how_to_convert(
    base: Path, sources: list[str], accounts: Accounts
) -> None:
    group, _gid = accounts.group()
    a = accounts.user(groups=(group,))
    log = str(base / "log")
    cache = base / "mine"
    run_as(a, get, str(cache), sources, log)
    with pytest.raises(tsc.UntrustedCacheError, match=f"chgrp -R {group} {cache}"):
        run_as(a, get, str(cache), sources, log, group)


def test_remote_copy_in_a_shared_cache_is_downloaded_once_for_the_group(
    base: Path, sources: list[str], accounts: Accounts
) -> None:
    pytest.importorskip("fsspec")
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    url = f"memory://tsc-perm-shared-{os.getpid()}/store.tsc"
    tsc.build_store(sources, url, cache_dir=base / "root-cache", loader=LogLoader(base / "log"),
                    workers=1, progress=False).close()
    team = base / "team"

    def read(url: str, cache: str, share: str) -> Any:
        with tsc.open_store(url, cache_dir=cache, share_with=share) as store:
            return np.array(store.take(store.rows(sources)))

    for user in (a, b):
        np.testing.assert_array_equal(run_as(user, read, url, str(team), group),
                                      expected(sources))
    (version,) = [p for p in (team / "remote").glob("*/*") if p.is_dir()]
    # files every member writes: the download lock, the version's holds (readers lock their
    # shards in it), the node cache's eviction lock and usage ledger; everything else is data
    member_write = {version.with_name(version.name + ".lock"),
                    version.with_name(version.name + ".holds"),
                    team / "remote" / "evict.lock", team / "remote" / "usage"}
    for p in [team, *team.rglob("*")]:
        st = p.lstat()
        assert st.st_gid == gid, p
        if p.is_dir():
            assert stat.S_IMODE(st.st_mode) == 0o2770, p
        else:
            assert stat.S_IMODE(st.st_mode) == (0o660 if p in member_write else 0o640), p
    # b found a's copy: every file of it is a's (b downloaded nothing)
    assert {p.lstat().st_uid for p in version.rglob("*")} == {a.uid}
    # a copy planted by a non-member is refused to the members
    outsider = accounts.user()
    os.chown(version / "zarr.json", outsider.uid, gid)
    with pytest.raises(tsc.UntrustedCacheError, match="not a member of group") as info:
        run_as(b, read, url, str(team), group)
    assert info.value.path == str(version / "zarr.json")


# -- stores of records ----------------------------------------------------------------------


@pytest.fixture
def record_sources(base: Path) -> list[str]:
    paths = _records.write_sources(base / "rsrc", 40)
    os.chmod(base / "rsrc", 0o755)
    log = base / "rlog"
    log.touch()
    os.chmod(log, 0o666)
    return paths


def get_records(cache: str, keys: list[str], log: str, share: str | int | None = None,
                gate: Gate | None = None) -> Any:
    if gate is not None:
        gate.wait()
    with tsc.cached(keys, cache_dir=cache, loader=_records.RecordLoader(log, boxes=True),
                    loader_id="rec/1", fields=_records.BOX_FIELDS, workers=1, progress=False,
                    share_with=share) as store:
        return [_records.same(store[k], _records.expected(k, boxes=True)) for k in keys]


def test_a_private_cache_of_records_has_private_modes(
    base: Path, record_sources: list[str]
) -> None:
    cache = base / "victim"
    got = run_as(VICTIM, get_records, str(cache), record_sources, str(base / "rlog"),
                 umask=0o002)
    assert got == [True] * len(record_sources)
    ns = only_namespace(cache)
    assert list(ns.rglob("fields/title_ids/values/c/0"))  # a part of records
    for p in [cache, *cache.rglob("*")]:
        assert mode(p) == (0o700 if p.is_dir() else 0o600), p
        assert p.lstat().st_uid == VICTIM[0]


def test_two_users_of_a_group_build_records_once_and_both_read(
    base: Path, record_sources: list[str], accounts: Accounts
) -> None:
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    log = str(base / "rlog")
    team = base / "team"
    gate = Gate()
    kids = [
        Child(a, get_records, str(team), record_sources, log, group, gate, umask=0o077),
        Child(b, get_records, str(team), record_sources, log, gid, gate, umask=0o022),
    ]
    try:
        gate.open()
        results = [k.result(120) for k in kids]
    finally:
        gate.close()
        for k in kids:
            k.kill()
    assert results == [[True] * len(record_sources)] * 2
    calls = log_lines(Path(log))
    assert sorted(k for _p, k in calls) == sorted(record_sources), "every record computed once"
    assert len({p for p, _k in calls}) == 1, "by one process"
    ns = only_namespace(team)
    assert list(ns.rglob("fields/pic/shapes/c/0/0"))
    member_write = {ns / "lock", ns / "last_used"}
    for p in [team, *team.rglob("*")]:
        st = p.lstat()
        assert st.st_gid == gid, p
        if p.is_dir():
            assert stat.S_IMODE(st.st_mode) == 0o2770, p
        else:
            assert stat.S_IMODE(st.st_mode) == (0o660 if p in member_write else 0o640), p
    assert run_as(b, get_records, str(team), record_sources, log, group) == [True] * 40
    assert len(log_lines(Path(log))) == len(record_sources)


def test_a_remote_store_of_records_in_a_shared_cache_is_fetched_once_for_the_group(
    base: Path, record_sources: list[str], accounts: Accounts
) -> None:
    pytest.importorskip("fsspec")
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    url = f"memory://tsc-perm-records-{os.getpid()}/store.tsc"
    tsc.build_store(record_sources, url, cache_dir=base / "root-cache",
                    loader=_records.RecordLoader(boxes=True), loader_id="rec/1",
                    fields=_records.BOX_FIELDS, workers=1, progress=False).close()
    team = base / "team"

    def read(url: str, cache: str, share: str, keys: list[str]) -> Any:
        with tsc.open_store(url, cache_dir=cache, share_with=share) as store:
            return [_records.same(store[k], _records.expected(k, boxes=True)) for k in keys]

    half = record_sources[:20]
    assert run_as(a, read, url, str(team), group, half) == [True] * 20
    assert run_as(b, read, url, str(team), group, record_sources) == [True] * 40
    (version,) = [p for p in (team / "remote").glob("*/*") if p.is_dir()]
    assert (version / "fields/title/values/c/0").is_file()
    member_write = {version.with_name(version.name + ".lock"),
                    version.with_name(version.name + ".holds"),
                    team / "remote" / "evict.lock", team / "remote" / "usage"}
    for p in [team, *team.rglob("*")]:
        st = p.lstat()
        assert st.st_gid == gid, p
        if p.is_dir():
            assert stat.S_IMODE(st.st_mode) == 0o2770, p
        else:
            assert stat.S_IMODE(st.st_mode) == (0o660 if p in member_write else 0o640), p
    # one file a field holds all 40 records: a fetched every one, b found them (fetched none)
    owners = {p.relative_to(version).as_posix(): p.lstat().st_uid
              for p in version.rglob("*") if p.is_file()}
    assert "fields/image/c/0/0/0/0" in owners and "fields/title_ids/offsets/c/0" in owners
    assert set(owners.values()) == {a.uid}
