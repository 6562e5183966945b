"""Layer 1, fs.trust and fs.opens: owner and mode checks on open descriptors, with real uids and gids.

Tests run as root: children forked from the test process switch to other
users (raw ids, or users and groups made for the test) and call the trust
functions there; what is asserted is what root can observe (owners, modes,
refusals and their messages).
"""

from __future__ import annotations

import os
import pickle
import stat
import time
import warnings
from pathlib import Path

import pytest

from tensorstore_cache import config
from tensorstore_cache.errors import StorePermissionWarning, UntrustedCacheError
from tensorstore_cache.fs import opens
from tensorstore_cache.fs import trust as tr

from ..support import _uids
from ..support._uids import Accounts, Gate, run_as

pytestmark = pytest.mark.skipif(not _uids.can_switch_users(), reason="needs root and fork")

# raw ids with no user or group entry: root can chown to them and switch to them
STRANGER = (64011, 64011, (64011,))
OTHER = (64012, 64012, (64012,))
RAW_GID = 64020


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- run in the children -----------------------------------------------------------------


def make_private(root: str) -> None:
    _make(root, tr.Trust.private())


def make_shared(root: str, group: str | int) -> None:
    _make(root, tr.resolve_trust(group))


def _make(root: str, trust: tr.Trust) -> None:
    """Create ``root/ns`` with a data file and a lock file, with the modes of ``trust``."""
    fd = opens.open_root(root, trust, create=True)
    try:
        sub = opens.open_dir("ns", trust, dir_fd=fd, create=True)
        os.close(opens.create_file("data", trust, dir_fd=sub))
        os.close(opens.create_file("lock", trust, dir_fd=sub, flags=os.O_RDWR, kind="member-write",
                               exclusive=False))
        os.close(sub)
    finally:
        os.close(fd)


def read_shared(root: str, group: str | int) -> str:
    trust = tr.resolve_trust(group)
    fd = opens.open_root(root, trust)
    try:
        sub = opens.open_dir("ns", trust, dir_fd=fd, shown=f"{root}/ns")
        try:
            # a member opens another member's lock file for writing
            os.close(opens.create_file("lock", trust, dir_fd=sub, flags=os.O_RDWR,
                                   kind="member-write", exclusive=False))
            os.close(opens.open_file("data", trust, dir_fd=sub, shown=f"{root}/ns/data"))
            os.close(opens.create_file(f"mine-{os.geteuid()}", trust, dir_fd=sub, exclusive=False))
        finally:
            os.close(sub)
    finally:
        os.close(fd)
    return "read"


def add_file(root: str, name: str) -> None:
    trust = tr.Trust.private()
    fd = opens.open_root(root, trust)
    try:
        sub = opens.open_dir("ns", trust, dir_fd=fd)
        os.close(opens.create_file(name, trust, dir_fd=sub))
        os.close(sub)
    finally:
        os.close(fd)


def open_private(root: str) -> None:
    os.close(opens.open_root(root, tr.Trust.private()))


def open_private_sub(root: str, name: str) -> None:
    fd = opens.open_root(root, tr.Trust.private())
    try:
        os.close(opens.open_dir(name, tr.Trust.private(), dir_fd=fd, shown=f"{root}/{name}"))
    finally:
        os.close(fd)


# -- private ----------------------------------------------------------------------------


def test_private_modes_through_a_sticky_parent_whatever_the_umask(base: Path) -> None:
    root = base / "cache"
    run_as(STRANGER, make_private, str(root))
    assert root.stat().st_uid == STRANGER[0]
    assert (mode(root), mode(root / "ns"), mode(root / "ns" / "data")) == (0o700, 0o700, 0o600)
    assert mode(root / "ns" / "lock") == 0o600
    # a looser umask does not loosen them; a stricter one is kept
    run_as(STRANGER, make_private, str(base / "loose"), umask=0o000)
    assert mode(base / "loose") == 0o700 and mode(base / "loose" / "ns" / "data") == 0o600
    run_as(STRANGER, add_file, str(root), "strict", umask=0o277)  # the umask's modes are kept
    assert mode(root / "ns" / "strict") == 0o400


def test_world_writable_parent_needs_the_sticky_bit(base: Path) -> None:
    loose = base / "open"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(UntrustedCacheError) as info:
        run_as(STRANGER, make_private, str(loose / "cache"))
    msg = str(info.value)
    assert f"chmod +t {loose}" in msg and "drwxrwxrwx (0777)" in msg
    assert info.value.path == str(loose) and isinstance(info.value, PermissionError)
    os.chmod(loose, 0o1777)
    run_as(STRANGER, make_private, str(loose / "cache"))  # as /tmp: fine


def test_a_sticky_world_writable_directory_is_no_cache_root(base: Path) -> None:
    with pytest.raises(UntrustedCacheError, match="a directory of your own inside it") as info:
        run_as(STRANGER, open_private, str(base))
    assert "drwxrwxrwt" in str(info.value) and info.value.reason == "world-writable"


def test_directory_of_another_uid_is_refused_even_unreadable(base: Path) -> None:
    root = base / "cache"
    run_as(STRANGER, make_private, str(root))
    # another user's directory in the first one's cache (root plants it for them)
    (root / "planted").mkdir(mode=0o755)
    os.chown(root / "planted", OTHER[0], OTHER[1])
    with pytest.raises(UntrustedCacheError) as info:
        run_as(STRANGER, open_private_sub, str(root), "planted")
    err = info.value
    assert err.path == str(root / "planted") and (err.uid, err.gid) == OTHER[:2]
    assert f"owned by uid {OTHER[0]}:{OTHER[1]}" in str(err)
    assert "cache_dir=" in str(err) and "share_with=GROUP" in str(err)
    run_as(STRANGER, open_private_sub, str(root), "ns")  # its own is fine
    (root / "by-root").mkdir(mode=0o755)  # root's directories are trusted too
    run_as(STRANGER, open_private_sub, str(root), "by-root")
    # one the OS does not even let it open is explained the same way, not a bare EACCES
    os.chmod(root / "planted", 0o700)
    with pytest.raises(UntrustedCacheError, match=f"owned by uid {OTHER[0]}"):
        run_as(STRANGER, open_private_sub, str(root), "planted")


def test_group_writable_is_refused_outside_shared_mode(base: Path) -> None:
    root = base / "cache"
    run_as(STRANGER, make_private, str(root))
    os.chmod(root / "ns", 0o770)
    with pytest.raises(UntrustedCacheError) as info:
        run_as(STRANGER, open_private_sub, str(root), "ns")
    msg = str(info.value)
    assert f"chmod go-w {root / 'ns'}" in msg and "share_with='64011'" in msg
    assert "drwxrwx---" in msg and info.value.reason == "writable by group 64011"
    os.chmod(root / "ns", 0o700)
    os.chmod(root, 0o707)
    with pytest.raises(UntrustedCacheError, match="anyone could change it"):
        run_as(STRANGER, open_private, str(root))


def test_a_personal_group_may_write(base: Path, accounts: Accounts) -> None:
    """Debian and Ubuntu give each user a group of their own and umask 002: not a refusal."""
    alice = accounts.user()
    group, gid = accounts.group()
    bob = accounts.user(groups=(group,))
    root = base / "cache"
    run_as(alice, make_private, str(root), umask=0o002)
    os.chmod(root / "ns", 0o775)  # as earlier versions made it under umask 002
    run_as(alice, open_private_sub, str(root), "ns")
    # a group with a second member is another story
    os.chown(root / "ns", alice.uid, gid)
    os.chmod(root / "ns", 0o775)
    with pytest.raises(UntrustedCacheError, match=f"the members of group {group}"):
        run_as(alice, open_private_sub, str(root), "ns")
    assert bob.uid != alice.uid


def test_the_check_is_made_on_the_descriptor_opened(base: Path) -> None:
    """A directory swapped in after the open is neither the one checked nor the one read."""
    root = base / "cache"
    (root / "ns").mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    fd = opens.open_root(root, tr.Trust.private())  # root's own: trusted
    try:
        # someone swaps in their own directory under the same name
        root.rename(base / "aside")
        (root / "ns").mkdir(parents=True)
        for p in (root, root / "ns"):
            os.chown(p, *STRANGER[:2])
        sub = opens.open_dir("ns", tr.Trust.private(), dir_fd=fd)  # still the checked directory
        assert os.fstat(sub).st_uid == 0
        os.close(sub)
        with pytest.raises(UntrustedCacheError):  # a fresh open sees the swap
            opens.open_root(root, tr.Trust.private())
    finally:
        os.close(fd)


def test_the_error_pickles_with_its_data() -> None:
    err = UntrustedCacheError("msg", "/x", 5, 6, 0o40777, "owned by uid 5")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UntrustedCacheError and str(back) == "msg"
    assert (back.path, back.uid, back.gid, back.mode, back.reason) == (
        "/x", 5, 6, 0o40777, "owned by uid 5")
    assert isinstance(back, PermissionError)


def test_explicit_paths_are_only_warned_about_once(tmp_path: Path) -> None:
    d = tmp_path / "store"
    d.mkdir()
    os.chown(d, *STRANGER[:2])  # someone else's, named by the user: not refused
    os.chmod(d, 0o777)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            os.close(opens.open_root(d, tr.Trust.explicit(d)))
        os.close(opens.open_root(d, tr.Trust.explicit(d, warn=False)))
    assert len(seen) == 1 and issubclass(seen[0].category, StorePermissionWarning)
    assert str(d) in str(seen[0].message) and "\n" not in str(seen[0].message)
    assert "writable by anyone (drwxrwxrwx)" in str(seen[0].message)


# -- shared -----------------------------------------------------------------------------


def test_shared_group_of_two_members(base: Path, accounts: Accounts) -> None:
    group, gid = accounts.group()
    a = accounts.user(groups=(group,))
    b = accounts.user(groups=(group,))
    outsider = accounts.user()
    root = base / "team"
    run_as(a, make_shared, str(root), group, umask=0o077)  # exact modes whatever the umask
    for d in (root, root / "ns"):
        st = d.stat()
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o2770, d
    assert mode(root / "ns" / "data") == 0o640 and (root / "ns" / "data").stat().st_gid == gid
    assert mode(root / "ns" / "lock") == 0o660
    assert run_as(b, read_shared, str(root), group) == "read"
    mine = root / "ns" / f"mine-{b.uid}"
    assert mine.stat().st_gid == gid and mode(mine) == 0o640
    assert run_as(b, read_shared, str(root), gid) == "read"  # by numeric gid
    assert run_as(b, read_shared, str(root), str(gid)) == "read"
    with pytest.raises(PermissionError, match="not a member of group") as info:
        run_as(outsider, read_shared, str(root), group)
    assert not isinstance(info.value, UntrustedCacheError)
    data = root / "ns" / "data"
    os.chown(data, outsider.uid, gid)  # a non-member's file (root plants it for them)
    with pytest.raises(UntrustedCacheError, match=f"not a member of group {group}"):
        run_as(b, read_shared, str(root), group)
    os.chown(data, a.uid, a.gid)  # a member's, of another group
    with pytest.raises(UntrustedCacheError, match=f"chgrp -R {group} {data}"):
        run_as(b, read_shared, str(root), group)
    os.chown(data, a.uid, gid)
    os.chmod(data, 0o646)
    with pytest.raises(UntrustedCacheError, match=f"chmod o-w {data}"):
        run_as(b, read_shared, str(root), group)
    os.chmod(data, 0o640)
    assert run_as(b, read_shared, str(root), group) == "read"
    # the same cache without share_with: refused, naming the group to share it with
    with pytest.raises(UntrustedCacheError, match=f"share_with='{group}'"):
        run_as(a, open_private, str(root))


def test_shared_by_a_raw_gid_without_a_group_entry(base: Path) -> None:
    me = (64031, 64031, (64031, RAW_GID))
    other = (64032, 64032, (64032, RAW_GID))
    root = base / "raw"
    run_as(me, make_shared, str(root), RAW_GID)
    assert root.stat().st_gid == RAW_GID and mode(root) == 0o2770
    # this process's own groups prove its membership; another uid without a user
    # entry cannot be shown to be a member, so its files are refused
    assert run_as(me, read_shared, str(root), RAW_GID) == "read"
    with pytest.raises(UntrustedCacheError, match="not a member"):
        run_as(other, read_shared, str(root), RAW_GID)


def test_resolve_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config.CACHE_GROUP_ENV, raising=False)
    assert tr.resolve_trust() == tr.Trust.private()
    monkeypatch.setenv(config.CACHE_GROUP_ENV, "  ")
    assert tr.resolve_trust() == tr.Trust.private()
    monkeypatch.setenv(config.CACHE_GROUP_ENV, "0")
    assert tr.resolve_trust() == tr.Trust.shared(0, "root")  # root is a member of every group
    with pytest.raises(ValueError, match="no group of that name"):
        tr.resolve_trust("no-such-group-here")
    with pytest.raises(TypeError):
        tr.resolve_trust(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid group id"):
        tr.resolve_trust(-1)
    assert pickle.loads(pickle.dumps(tr.Trust.shared(5, "x"))) == tr.Trust.shared(5, "x")


def test_membership() -> None:
    assert tr.is_member(0, 12345)
    assert tr.is_member(os.geteuid(), os.getegid())
    assert not tr.is_member(64099, 64099)  # no user entry


def _wait_then_report(gate: Gate) -> float:
    gate.wait()
    return time.monotonic()


def test_gate_releases_children_together() -> None:
    gate = Gate()
    kids = [_uids.Child(STRANGER, _wait_then_report, gate) for _ in range(3)]
    try:
        time.sleep(0.3)
        opened = time.monotonic()
        gate.open()
        times = [k.result(30) for k in kids]
        assert all(t >= opened for t in times)
    finally:
        gate.close()
        for k in kids:
            k.kill()
