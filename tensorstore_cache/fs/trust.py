"""Trust policies: who may have written what a cache reads, and the modes it creates.

Anyone who can write into a cache directory could plant vectors that every
other user of it then trains on. So everything a cache reads is opened first
and checked with ``fstat`` on the descriptor actually opened (never a
``stat`` of a path, which could be swapped in between), by one function,
:func:`check_stat`, under one of three policies (:class:`Trust`):

``private`` (the default of ``cached()`` and of the node copies of remote stores)
    owned by the current user or root, and writable by nobody else: no world
    write bit, and no group write bit unless the group is the owner's
    personal group (the owner is its only member, as Debian and Ubuntu give
    every user, with ``umask 002``).
``shared`` (``share_with=`` a group, or ``TSC_CACHE_GROUP``)
    owned by a member of the group (or root), group-owned by it, not
    world-writable. Members may write each other's directories.
``explicit`` (a path the user names: ``open_store(path)``, ``build_store(path)``)
    never refused, like opening any file; a directory or file that others
    can write gets one :class:`~tensorstore_cache.errors.StorePermissionWarning`
    per store.

The directory holding a cache root may be world-writable only with the sticky
bit (as ``/tmp``): without it anyone could rename the cache away and put
another in its place.

Opening and creating, with these checks, is :mod:`~tensorstore_cache.fs.opens`'s job.
Creation follows the policy: ``private`` creates directories ``0o700`` and
files ``0o600`` through the umask (a stricter umask wins); ``shared`` sets
exact modes whatever the umask: directories group-owned, setgid, ``0o2770``;
files ``0o640``, or ``0o660`` for the files every member opens for writing
(lock files, ``last_used``: ``kind="member-write"``).
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from typing import Final, Literal

from .. import config
from ..errors import StorePermissionWarning, UntrustedCacheError, warn_once

__all__ = [
    "EXPLICIT",
    "FileKind",
    "Trust",
    "TrustKind",
    "apply_modes",
    "check_fd",
    "check_parent",
    "check_stat",
    "describe_owner",
    "group_name",
    "is_member",
    "passes",
    "resolve_trust",
    "user_name",
]

TrustKind = Literal["private", "shared", "explicit"]
"""Whose files a cache may read (see :class:`Trust`)."""
FileKind = Literal["data", "member-write"]
"""``"data"``: written once by its creator; ``"member-write"``: opened for writing by every user."""

_DIR_MODE = {"private": 0o700, "shared": 0o2770, "explicit": 0o777}
_FILE_MODE = {"private": 0o600, "shared": 0o640, "explicit": 0o644}
_MEMBER_WRITE_MODE = {"private": 0o600, "shared": 0o660, "explicit": 0o644}


@dataclass(frozen=True, slots=True)
class Trust:
    """Whose files a cache may read, and the modes it creates.

    Picklable: it travels with a store to worker processes and with build
    tasks. Build one with :meth:`private`, :meth:`shared`, :meth:`explicit`
    or :func:`resolve_trust`.
    """

    kind: TrustKind = "private"
    """``"private"``, ``"shared"`` or ``"explicit"``."""
    gid: int | None = None
    """The sharing group (``"shared"`` only)."""
    group: str = ""
    """The group's name, for messages."""
    scope: str = ""
    """``"explicit"``: the store warned about (once); empty: each path once."""
    warn: bool = True
    """``"explicit"``: whether to warn at all (not when reading back what was just written)."""

    @classmethod
    def private(cls) -> Trust:
        """The current user's own cache."""
        return cls("private")

    @classmethod
    def shared(cls, gid: int, group: str = "") -> Trust:
        """A cache shared by the members of group ``gid``."""
        return cls("shared", gid, group or group_name(gid))

    @classmethod
    def explicit(cls, scope: str | os.PathLike[str] = "", *, warn: bool = True) -> Trust:
        """A store the user named by its path: warn (once per ``scope``), never refuse."""
        return cls("explicit", scope=os.fspath(scope), warn=warn)

    @property
    def dir_mode(self) -> int:
        """Mode of the directories created (through the umask unless :attr:`exact`)."""
        return _DIR_MODE[self.kind]

    @property
    def file_mode(self) -> int:
        """Mode of created files nobody writes after creating them."""
        return _FILE_MODE[self.kind]

    @property
    def member_write_mode(self) -> int:
        """Mode of created files every user of the cache opens for writing (locks, ``last_used``)."""
        return _MEMBER_WRITE_MODE[self.kind]

    @property
    def exact(self) -> bool:
        """Whether modes are set exactly (``shared``) rather than through the umask."""
        return self.kind == "shared"

    def mode_of(self, kind: FileKind) -> int:
        """Return :attr:`file_mode` or :attr:`member_write_mode`."""
        return self.file_mode if kind == "data" else self.member_write_mode


EXPLICIT: Final[Trust] = Trust("explicit")
"""The policy of paths the user names, warning about each path once."""


def group_name(gid: int) -> str:
    """Return the name of group ``gid``, or the number when it has no entry."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def user_name(uid: int) -> str:
    """Return the name of user ``uid``, or ``"uid N"`` when it has no entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def describe_owner(st: os.stat_result) -> tuple[str, str, str]:
    """Return ``(owner, group, mode)`` of a stat as ``ls -l`` shows them."""
    return user_name(st.st_uid), group_name(st.st_gid), stat.filemode(st.st_mode)


def resolve_trust(share_with: str | int | None = None) -> Trust:
    """Return the policy of a cache: shared with ``share_with`` (or ``$TSC_CACHE_GROUP``), else private.

    Parameters
    ----------
    share_with
        A group name, or a numeric gid (an ``int`` or a string of digits).
        ``None`` reads ``TSC_CACHE_GROUP``; unset or empty means private.

    Raises
    ------
    TypeError
        If ``share_with`` is neither a string nor an int.
    ValueError
        If no group has that name, or the gid is out of range.
    PermissionError
        If the current user is not a member of the group (root always is).
    """
    source = "share_with"
    if share_with is None:
        share_with = os.environ.get(config.CACHE_GROUP_ENV, "").strip() or None
        source = config.CACHE_GROUP_ENV
        if share_with is None:
            return Trust.private()
    if isinstance(share_with, bool) or not isinstance(share_with, (str, int)):
        raise TypeError(f"share_with must be a group name or a numeric gid, got {share_with!r}")
    if isinstance(share_with, int) or share_with.isdigit():
        gid = int(share_with)
        if not 0 <= gid < 2**32 - 1:
            raise ValueError(f"{source}={share_with!r} is not a valid group id")
        name = group_name(gid)
    else:
        try:
            gid = grp.getgrnam(share_with).gr_gid
        except KeyError:
            raise ValueError(
                f"{source}={share_with!r}: there is no group of that name on this machine; "
                "give the name or the numeric id of a group you belong to (`id` lists them)"
            ) from None
        name = share_with
    euid = os.geteuid()
    if euid != 0 and not is_member(euid, gid):
        raise PermissionError(
            f"{source}={share_with!r}: you ({user_name(euid)}) are not a member of group "
            f"{name} (gid {gid}); ask its administrator to add you (a new login session "
            "then sees it: `id` lists your groups), or use a private cache"
        )
    return Trust.shared(gid, name)


def is_member(uid: int, gid: int) -> bool:
    """Whether user ``uid`` belongs to group ``gid`` (root belongs to every group).

    The current user's groups are those of this process (so a numeric gid
    with no group entry works); another user's come from the user and group
    databases (``getgrouplist``: LDAP and other NSS sources count). A uid
    without a user entry belongs to no group. Answers are kept for the life
    of the process.
    """
    return _is_member(uid, gid, os.geteuid())


@functools.lru_cache(maxsize=1024)
def _is_member(uid: int, gid: int, euid: int) -> bool:
    if uid == 0:
        return True
    if uid == euid:
        return gid == os.getegid() or gid in os.getgroups()
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    if pw.pw_gid == gid:
        return True
    try:
        return gid in os.getgrouplist(pw.pw_name, pw.pw_gid)
    except OSError:
        return False


@functools.lru_cache(maxsize=256)
def _personal_group(gid: int, uid: int) -> bool:
    """Whether ``uid`` is the only member of group ``gid`` (a user private group).

    As Debian's OpenSSH decides it for StrictModes: the group exists, every
    user whose primary group it is is ``uid``, at most ``uid`` is listed as
    a supplementary member, and ``uid`` is a member at all.
    """
    try:
        gr = grp.getgrgid(gid)
        owner = pwd.getpwuid(uid)
    except KeyError:
        return False
    if any(m != owner.pw_name for m in gr.gr_mem):
        return False
    primary = [pw.pw_uid for pw in pwd.getpwall() if pw.pw_gid == gid]
    if any(u != uid for u in primary):
        return False
    return bool(primary) or owner.pw_name in gr.gr_mem


def _group_writable(st: os.stat_result) -> bool:
    """Group write bit set, and the group has someone besides the owner."""
    return bool(st.st_mode & 0o020) and not _personal_group(st.st_gid, st.st_uid)


# -- the check ---------------------------------------------------------------------------


def passes(st: os.stat_result, trust: Trust) -> bool:
    """The fast path of :func:`check_stat`: True when it would neither refuse nor warn.

    For callers that name the path only when needed (building a path costs
    more than this check): ``if not passes(st, trust): check_stat(st, path, trust)``.
    """
    mode = st.st_mode
    kind = trust.kind
    if kind == "private":
        uid = st.st_uid
        return not mode & 0o022 and (uid == 0 or uid == os.geteuid())
    if kind == "shared":
        uid = st.st_uid
        return (
            not mode & 0o002
            and st.st_gid == trust.gid
            and (uid == os.geteuid() or _is_member(uid, st.st_gid, os.geteuid()))
        )
    return not mode & 0o022


def check_stat(st: os.stat_result, path: str | os.PathLike[str], trust: Trust) -> None:
    """Refuse what someone the policy does not trust could have written.

    The one trust check of the package: every directory and file a cache
    reads is opened, then passed here with the ``fstat`` of that very
    descriptor.

    Parameters
    ----------
    st
        ``os.fstat`` of the opened descriptor.
    path
        Its path, for messages.
    trust
        The policy.

    Raises
    ------
    UntrustedCacheError
        Under ``private`` and ``shared``: naming the path, its owner and mode,
        and how to fix it. ``explicit`` only warns (once per store).
    """
    if not passes(st, trust):  # the common case builds nothing: this runs for every file opened
        _check_slow(st, os.fspath(path), trust)




def _refuse(path: str, st: os.stat_result, reason: str, why: str, fix: str) -> UntrustedCacheError:
    what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
    owner, group, mode = describe_owner(st)
    return UntrustedCacheError(
        f"refusing the cache {what} {path}: it is owned by {owner}:{group} with mode {mode} "
        f"({stat.S_IMODE(st.st_mode):04o}), so {why}; {fix}",
        path,
        st.st_uid,
        st.st_gid,
        st.st_mode,
        reason,
    )


def _check_slow(st: os.stat_result, where: str, trust: Trust) -> None:
    mode = st.st_mode
    if trust.kind == "explicit":
        if trust.warn and (mode & 0o002 or _group_writable(st)):
            key = trust.scope or where
            who = "anyone" if mode & 0o002 else f"the members of group {group_name(st.st_gid)}"
            warn_once(
                ("writable store", key),
                f"{where} is writable by {who} ({stat.filemode(mode)}), who can change what "
                f"the store {key} returns",
                StorePermissionWarning,
                stacklevel=4,
            )
        return
    if trust.kind == "private":
        _check_private(st, where)
    else:
        _check_shared(st, where, trust)


def _check_private(st: os.stat_result, where: str) -> None:
    """Refuse what a private cache must not be: another's, or writable by others."""
    mode = st.st_mode
    uid = st.st_uid
    euid = os.geteuid()
    if uid not in (euid, 0):
        if _group_writable(st) and is_member(euid, st.st_gid):
            # a cache shared with a group of ours: say which share_with opens it
            group = group_name(st.st_gid)
            share = (f"if the cache is meant to be shared with group {group}, pass "
                     f"share_with={group!r} (or set TSC_CACHE_GROUP={group})")
        else:
            share = ("to share a cache with a team, every member passes share_with=GROUP "
                     "(or sets TSC_CACHE_GROUP)")
        raise _refuse(
            where, st, f"owned by {user_name(uid)}",
            f"someone else ({user_name(uid)}) could have put any vectors in it",
            "remove it (as its owner or root), or use a cache directory of your own "
            f"(cache_dir=... or TSC_CACHE_DIR); {share}",
        )
    if mode & 0o002:
        if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
            raise _refuse(
                where, st, "world-writable",
                "anyone could create files in it",
                f"use a directory of your own inside it as the cache directory (e.g. "
                f"{os.path.join(where, 'tsc-' + user_name(euid))})",
            )
        raise _refuse(
            where, st, "world-writable", "anyone could change it",
            f"run `chmod go-w {where}`",
        )
    if _group_writable(st):
        group = group_name(st.st_gid)
        raise _refuse(
            where, st, f"writable by group {group}",
            f"the members of group {group} could change it",
            f"run `chmod go-w {where}`, or, if the cache is meant to be shared with group "
            f"{group}, pass share_with={group!r} (or set TSC_CACHE_GROUP={group})",
        )


def _check_shared(st: os.stat_result, where: str, trust: Trust) -> None:
    """Refuse what a cache shared with a group must not be: owned by a non-member, of
    another group, or world-writable."""
    mode = st.st_mode
    uid = st.st_uid
    euid = os.geteuid()
    assert trust.gid is not None
    group = trust.group or str(trust.gid)
    if not (uid == euid or is_member(uid, trust.gid)):
        raise _refuse(
            where, st, f"owned by non-member {user_name(uid)}",
            f"its owner {user_name(uid)} is not a member of group {group}, which this cache is "
            "shared with",
            f"remove it (as its owner or root), or add {user_name(uid)} to group {group} if "
            "they are to be trusted",
        )
    if st.st_gid != trust.gid:
        found = group_name(st.st_gid)
        raise _refuse(
            where, st, f"group {found}, not {group}",
            f"it does not belong to group {group}, which this cache is shared with",
            f"to share it, run `chgrp -R {group} {where} && chmod -R g+rwX,o-w {where} && "
            f"find {where} -type d -exec chmod g+s {{}} +`; or drop share_with to use it as "
            "a private cache",
        )
    if mode & 0o002:
        raise _refuse(
            where, st, "world-writable", "anyone could change it", f"run `chmod o-w {where}`",
        )


def check_fd(fd: int, path: str | os.PathLike[str], trust: Trust) -> os.stat_result:
    """``fstat`` the descriptor and :func:`check_stat` it; return the stat (closes nothing)."""
    st = os.fstat(fd)
    check_stat(st, path, trust)
    return st


def check_parent(st: os.stat_result, path: str, trust: Trust) -> None:
    """Refuse a directory holding a cache root that is world-writable without the sticky bit."""
    if trust.kind == "explicit" or not st.st_mode & 0o002 or st.st_mode & stat.S_ISVTX:
        return
    raise _refuse(
        path, st, "world-writable parent without the sticky bit",
        "anyone could rename the cache directory inside it and put another in its place",
        f"run `chmod +t {path}` (as its owner or root), as /tmp has, or choose a cache "
        "directory whose parent others cannot write",
    )


# -- creating ----------------------------------------------------------------------------


def apply_modes(fd: int, trust: Trust, mode: int) -> None:
    """Give a just-created directory or file the policy's group and mode.

    ``shared``: the share group and exactly ``mode`` (``fchown`` first:
    setgid is only kept for the file's own group). ``private``: the group and
    world bits are cleared (for files created by other code, e.g. a
    download). ``explicit``: nothing.
    """
    if trust.kind == "explicit":
        return
    st = os.fstat(fd)
    if trust.kind == "private":
        if st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
        return
    assert trust.gid is not None
    if st.st_gid != trust.gid:
        os.fchown(fd, -1, trust.gid)
    if stat.S_IMODE(st.st_mode) != mode or st.st_gid != trust.gid:
        os.fchmod(fd, mode)
