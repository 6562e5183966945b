"""Which filesystem holds a path: ``/proc/self/mountinfo`` first, ``statfs`` where it is missing.

A memory map of a file on a network filesystem (NFS, SMB, Lustre, GPFS,
BeeGFS, CephFS, most FUSE mounts) pages over the network and dies with
``SIGBUS`` when the server hiccups; such stores are read through the node
cache instead (see :mod:`tensorstore_cache.remote.shards`). ``fuse-overlayfs`` (rootless
containers) and other FUSE filesystems over local storage are local.

Both sources are module attributes so tests can stand in a mount table or a
``statfs`` answer: ``MOUNTINFO`` (a path) and ``statfs_type`` (a function).
:func:`network_mount` asks ``statfs`` first (one system call answers for ext4,
xfs, btrfs, tmpfs, overlayfs, ...) and reads the mount table only otherwise.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["MOUNTINFO", "Mount", "mount_of", "network_mount", "parse_mountinfo", "statfs_type"]

#: The mount table read by :func:`mount_of` (tests point it at a file of their own).
MOUNTINFO = "/proc/self/mountinfo"

# Kernel filesystem types whose files live on another machine (or a shared cluster device).
_NETWORK_TYPES = frozenset({
    "9p", "afs", "beegfs", "ceph", "cifs", "coda", "gfs2", "glusterfs", "gpfs", "lustre",
    "ncpfs", "nfs", "nfs4", "ocfs2", "orangefs", "panfs", "pvfs2", "quobyte", "smb3",
    "smbfs", "vboxsf", "wekafs",
})
# FUSE subtypes known to serve local storage; any other FUSE mount counts as network
# (s3fs, gcsfuse, sshfs, rclone, goofys, blobfuse, juicefs, cvmfs, ...).
_LOCAL_FUSE = frozenset({
    "bindfs", "encfs", "erofsfuse", "fuse-overlayfs", "fuse2fs", "gocryptfs", "lxcfs",
    "squashfuse", "squashfuse_ll",
})
# statfs f_type magic numbers (linux/magic.h and the vendors' headers), for hosts without
# /proc/self/mountinfo.
_NETWORK_MAGIC = {
    0x6969: "nfs", 0x517B: "smbfs", 0xFF534D42: "cifs", 0xFE534D42: "smb3",
    0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x19830326: "beegfs", 0x00C36400: "ceph",
    0x5346414F: "afs", 0x01021997: "9p", 0x73757245: "coda", 0x7461636F: "ocfs2",
    0x01161970: "gfs2", 0x564C: "ncpfs", 0x65735546: "fuse",
}


@dataclass(frozen=True, slots=True)
class Mount:
    """The filesystem a path lives on."""

    point: str
    """Its mount point (``""`` when only ``statfs`` answered)."""
    fstype: str
    """Kernel type, FUSE mounts as ``fuse.<subtype>`` (``"nfs4"``, ``"fuse.sshfs"``, ``"ext4"``)."""
    source: str
    """What is mounted (``server:/export``, a device, ...)."""

    @property
    def network(self) -> bool:
        """Whether the files live elsewhere: a network filesystem or a FUSE mount not known as local."""
        kind = self.fstype
        if kind in _NETWORK_TYPES:
            return True
        if kind == "fuseblk":  # FUSE over a local block device (ntfs-3g, exfat)
            return False
        if kind == "fuse" or kind.startswith("fuse."):
            sub = kind[5:] if kind.startswith("fuse.") else self.source.split("#", 1)[0]
            return sub not in _LOCAL_FUSE
        return False

    def describe(self) -> str:
        """Return e.g. ``"nfs4 (server:/export on /mnt/data)"``."""
        where = f" on {self.point}" if self.point else ""
        return f"{self.fstype} ({self.source}{where})" if self.source else f"{self.fstype}{where}"


def _unescape(field: str) -> str:
    """Decode mountinfo's octal escapes (``\\040`` for a space, ...)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and len(field[i + 1 : i + 4]) == 3:
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse the text of ``/proc/<pid>/mountinfo`` (malformed lines are skipped)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3 or len(fields) < 5:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2])))
    return mounts


def _covers(point: str, path: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


#: ``struct statfs`` (120 bytes on 64-bit Linux), its first field ``f_type``.
_StatfsBuffer = ctypes.c_long * 32
_statfs: Any = None
if sys.platform.startswith("linux"):
    try:
        _statfs = ctypes.CDLL(None, use_errno=True).statfs
        _statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        _statfs.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - no libc
        _statfs = None


def _libc_statfs_type(path: str) -> int | None:
    """``f_type`` of ``statfs(path)``, or ``None`` where it cannot be asked."""
    if _statfs is None:
        return None
    buf = _StatfsBuffer()  # a type made once: making one per call costs more than statfs
    if _statfs(os.fsencode(path), buf) != 0:
        return None
    return int(buf[0]) & 0xFFFFFFFF


#: ``f_type`` of a path's filesystem (tests stand in their own answer).
statfs_type: Any = _libc_statfs_type


# statfs f_type of common local filesystems: a path on one of them needs no mount table
# (ext2/3/4, xfs, btrfs, tmpfs, overlayfs, zfs, f2fs, ramfs, squashfs, erofs).
_LOCAL_MAGIC = frozenset({
    0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0x794C7630, 0x2FC12FC1, 0xF2F52010,
    0x858458F6, 0x73717368, 0xE0F5E1E2,
})


def network_mount(path: str | os.PathLike[str]) -> Mount | None:
    """Return the network filesystem holding ``path``, or ``None`` if it is local (or unknown).

    One ``statfs`` answers for the common local filesystems; the mount table
    is read only for the others (FUSE, network, unusual types).
    """
    if statfs_type(os.fspath(path)) in _LOCAL_MAGIC:  # statfs follows symlinks itself
        return None
    mount = mount_of(os.path.realpath(os.fspath(path)))
    return mount if mount is not None and mount.network else None


def mount_of(path: str | os.PathLike[str]) -> Mount | None:
    """Return the filesystem holding ``path`` (which must exist), or ``None`` if unknown.

    The mount table gives the type and, for FUSE, the subtype; the mount is
    the one with the longest mount point above the path's real location (the
    last one listed for a stacked mount point). Without a mount table,
    ``statfs`` gives the type of the known network filesystems only.
    """
    real = os.path.realpath(os.fspath(path))
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        text = ""
    best: Mount | None = None
    for mount in parse_mountinfo(text):
        if _covers(mount.point, real) and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    if best is not None:
        return best
    magic = statfs_type(real)
    if magic is None:
        return None
    return Mount("", _NETWORK_MAGIC.get(magic, f"0x{magic:x}"), "")
