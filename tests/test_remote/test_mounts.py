"""Which filesystem holds a path: the mount table (a stand-in table), statfs, the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorstore_cache.fs import mounts

TABLE = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
60 27 0:50 / {base}/nfs rw,relatime shared:5 - nfs4 filer:/export rw,vers=4.2
61 27 0:51 / {base}/smb\040share rw - cifs //nas/share rw
62 27 0:52 / {base}/s3 rw - fuse.s3fs s3fs rw
63 27 0:53 / {base}/ovl rw - fuse.fuse-overlayfs fuse-overlayfs rw
64 27 0:54 / {base}/old rw - fuse sshfs#me@host: rw
65 27 0:55 / {base}/usb rw - fuseblk /dev/sdb1 rw
66 60 0:56 / {base}/nfs/scratch rw - ext4 /dev/vdb rw
67 27 0:57 / {base}/lustre rw - lustre 10.0.0.1@tcp:/fs rw
"""


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for d in ("nfs/scratch", "smb share/x", "s3", "ovl", "old", "usb", "lustre", "local"):
        (tmp_path / d).mkdir(parents=True)
    info = tmp_path / "mountinfo"
    info.write_text(TABLE.format(base=tmp_path))
    monkeypatch.setattr(mounts, "MOUNTINFO", str(info))
    return tmp_path


@pytest.mark.parametrize(
    ("sub", "fstype", "network"),
    [
        ("nfs", "nfs4", True),
        ("nfs/scratch", "ext4", False),  # a local disk mounted below the NFS mount
        ("smb share/x", "cifs", True),  # \040 in the table
        ("s3", "fuse.s3fs", True),
        ("ovl", "fuse.fuse-overlayfs", False),
        ("old", "fuse", True),
        ("usb", "fuseblk", False),
        ("lustre", "lustre", True),
        ("local", "ext4", False),
    ],
)
def test_mount_table(table: Path, sub: str, fstype: str, network: bool) -> None:
    m = mounts.mount_of(table / sub)
    assert m is not None and m.fstype == fstype and m.network is network


def test_symlink_is_resolved(table: Path) -> None:
    (table / "local" / "link").symlink_to(table / "nfs")
    m = mounts.mount_of(table / "local" / "link")
    assert m is not None and m.fstype == "nfs4" and "filer:/export" in m.describe()


def test_statfs_when_there_is_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(mounts, "statfs_type", lambda p: 0x6969)
    m = mounts.mount_of(tmp_path)
    assert m is not None and m.fstype == "nfs" and m.network
    monkeypatch.setattr(mounts, "statfs_type", lambda p: 0xEF53)
    m = mounts.mount_of(tmp_path)
    assert m is not None and not m.network


def test_real_table_says_this_disk_is_local(tmp_path: Path) -> None:
    m = mounts.mount_of(tmp_path)
    assert m is not None and not m.network
    assert mounts._libc_statfs_type(str(tmp_path)) not in (None, 0x6969)


def test_network_mount_asks_statfs_first(table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mounts, "statfs_type", lambda p: 0xEF53)  # ext4: no table needed
    assert mounts.network_mount(table / "nfs") is None
    monkeypatch.setattr(mounts, "statfs_type", lambda p: 0x6969)
    m = mounts.network_mount(table / "nfs")
    assert m is not None and m.fstype == "nfs4"
    assert mounts.network_mount(table / "ovl") is None  # fuse-overlayfs: local
    assert mounts.network_mount(tmp := table / "local") is None and tmp.is_dir()
