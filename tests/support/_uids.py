"""Run test code as other users: real uids and gids, switched in a forked child.

Tests run as root. A child forked from the test process drops to another user
with ``setgroups``/``setgid``/``setuid`` and runs a function there; its result
(or its exception, pickled) comes back through a pipe. No new interpreter is
started: the interpreter and the checkout may live where other users cannot
read them (root's home), so every module the child needs is imported before
the fork (:func:`preload`).

Users and groups are made for a test with ``groupadd``/``useradd`` and removed
afterwards; their names carry the creating pid, so that leftovers of a killed
run are removed by the next one. Raw ids (``os.chown`` to a uid with no user
entry) need no database at all.
"""

from __future__ import annotations

import contextlib
import grp
import importlib
import os
import pickle
import pkgutil
import pwd
import select
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "tsct"

Ids = tuple[int, int, tuple[int, ...]]
"""``(uid, gid, supplementary gids)``: a user that needs no entry in the user database."""


def can_switch_users() -> bool:
    """Whether this process can fork children and give them other uids (root on a POSIX system)."""
    return hasattr(os, "fork") and os.geteuid() == 0


def preload(package: str, *, skip: tuple[str, ...] = ()) -> None:
    """Import every module of ``package`` now, so a child needs no file it may not read.

    Modules whose last name is in ``skip`` (heavy integrations) are left out.
    """
    pkg = importlib.import_module(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] not in skip:
            importlib.import_module(info.name)


@dataclass(frozen=True)
class User:
    """A user made for a test."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


class ChildError(Exception):
    """A child died without reporting (a crash, a signal, a timeout)."""


class Gate:
    """A barrier for forked children: they block in :meth:`wait` until the parent calls :meth:`open`.

    A pipe whose write end the parent closes: nothing a switched user might
    not be allowed to open.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()

    def wait(self) -> None:
        """In a child: wait for the parent to open the gate."""
        os.close(self._w)  # the child's copy: EOF comes once the parent closes its own
        os.read(self._r, 1)

    def open(self) -> None:
        """In the parent: release every waiting child."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1

    def close(self) -> None:
        """In the parent: release the children and close the pipe."""
        self.open()
        if self._r >= 0:
            os.close(self._r)
            self._r = -1


def _ids(user: User | Ids) -> Ids:
    if isinstance(user, User):
        return user.uid, user.gid, user.groups
    return user


class Child:
    """``fn(*args)`` running in a forked child as another user; :meth:`result` collects it."""

    def __init__(
        self,
        user: User | Ids,
        fn: Callable[..., Any],
        *args: Any,
        cwd: str | None = None,
        umask: int = 0o022,
        env: dict[str, str] | None = None,
    ) -> None:
        uid, gid, groups = _ids(user)
        self.uid = uid
        self.name = getattr(fn, "__name__", repr(fn))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the test runner
            status = 0
            try:
                os.close(r)
                outcome: tuple[str, Any, str]
                try:
                    os.chdir(cwd if cwd is not None else "/")
                    os.environ.update(env or {})
                    os.umask(umask)
                    os.setgroups(list(groups))
                    os.setgid(gid)
                    os.setuid(uid)
                    outcome = ("ok", fn(*args), "")
                except BaseException as exc:
                    outcome = ("raised", exc, traceback.format_exc())
                try:
                    data = pickle.dumps(outcome)
                except Exception as exc:
                    data = pickle.dumps(
                        ("raised", ChildError(f"unpicklable outcome {outcome!r}: {exc}"), "")
                    )
                view = memoryview(data)
                while view:
                    view = view[os.write(w, view):]
                os.close(w)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(w)
        self.pid = pid
        self._r = r

    def result(self, timeout: float = 120.0) -> Any:
        """Wait for the child; return its result or raise its exception (killed at ``timeout``)."""
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChildError(f"the child running {self.name} as uid {self.uid} timed out")
                ready, _, _ = select.select([self._r], [], [], left)
                if not ready:
                    continue
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            self.kill()
        if not chunks:
            raise ChildError(f"the child running {self.name} as uid {self.uid} died without a result")
        kind, value, tb = pickle.loads(b"".join(chunks))
        if kind == "ok":
            return value
        if tb and isinstance(value, BaseException):
            value.add_note(f"in the child (uid {self.uid}):\n{tb}")
        raise value

    def kill(self) -> None:
        """Kill (if still running) and reap the child; idempotent."""
        if self._r >= 0:
            os.close(self._r)
            self._r = -1
        if self.pid:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
            self.pid = 0


def run_as(
    user: User | Ids,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    cwd: str | None = None,
    umask: int = 0o022,
    env: dict[str, str] | None = None,
) -> Any:
    """Run ``fn(*args)`` in a forked child as ``user``; return its result or raise its exception."""
    return Child(user, fn, *args, cwd=cwd, umask=umask, env=env).result(timeout)


# -- users and groups made for a test ---------------------------------------------------


def _retry(cmd: list[str]) -> None:
    """Run a user-database command, retrying while another one holds the database lock."""
    for attempt in range(50):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return
        if "lock" not in (proc.stderr + proc.stdout).lower() or attempt == 49:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _leftover(name: str) -> bool:
    parts = name.split("-")
    return parts[0] == PREFIX and len(parts) == 3 and parts[1].isdigit() and not _alive(int(parts[1]))


def remove_leftovers() -> None:
    """Delete users and groups of earlier runs whose creating process is gone."""
    for pw in pwd.getpwall():
        if _leftover(pw.pw_name):
            with contextlib.suppress(RuntimeError):
                _retry(["userdel", pw.pw_name])
    for gr in grp.getgrall():
        if _leftover(gr.gr_name):
            with contextlib.suppress(RuntimeError):
                _retry(["groupdel", gr.gr_name])


def have_user_tools() -> bool:
    """Whether ``useradd`` and friends are installed."""
    return all(shutil.which(t) for t in ("useradd", "userdel", "groupadd", "groupdel"))


class Accounts:
    """Users and groups created for one test, removed by :meth:`close`."""

    def __init__(self) -> None:
        self.users: list[str] = []
        self.groups: list[str] = []

    def _name(self) -> str:
        return f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    def group(self) -> tuple[str, int]:
        """Create a group; return its name and gid."""
        name = self._name()
        _retry(["groupadd", name])
        self.groups.append(name)
        return name, grp.getgrnam(name).gr_gid

    def user(self, *, groups: tuple[str, ...] = ()) -> User:
        """Create a user with a personal group, member of ``groups`` too."""
        name = self._name()
        cmd = ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin"]
        if groups:
            cmd += ["--groups", ",".join(groups)]
        _retry([*cmd, name])
        self.users.append(name)
        pw = pwd.getpwnam(name)
        extra = tuple(grp.getgrnam(g).gr_gid for g in groups)
        return User(name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, *extra))

    def close(self) -> None:
        """Remove every user and group made (users first: their personal groups go with them)."""
        for name in reversed(self.users):
            with contextlib.suppress(RuntimeError):
                _retry(["userdel", name])
        for name in reversed(self.groups):
            with contextlib.suppress(RuntimeError):
                _retry(["groupdel", name])


@contextlib.contextmanager
def shared_base() -> Iterator[Path]:
    """A fresh ``0o1777`` directory directly in ``/tmp`` (as ``/tmp`` itself), removed afterwards.

    Pytest's temporary directories are ``0o700`` under root's: other users
    could not reach them.
    """
    base = Path(tempfile.mkdtemp(prefix="tsc-users-", dir="/tmp"))
    try:
        os.chmod(base, 0o1777)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
