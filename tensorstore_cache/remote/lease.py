"""Leases: which machine builds on top of a generation, so the others need not.

A lease saves duplicate work; it never decides correctness (a commit is a
create-only manifest, see :mod:`~tensorstore_cache.remote.manifests`). The
lease to build on generation ``g`` is the object ``leases/g<g>.a<attempt>.json``,
created once (create-only, so one machine wins each attempt) and then written
only by its holder: a heartbeat counter every ``heartbeat`` seconds, and
``"released"`` when it is done. It holds its ``kind`` and ``version``, the
counter (``beats``), its ``state`` (``"held"`` or ``"released"``), the
holder's ``host`` and ``pid`` (shown to waiters, never compared) and its
``writer`` token.

A waiter never compares clocks across machines: it watches the counter on
its own monotonic clock, and when the lease has not changed for a lease time
(``ttl``), or was released without a commit, it tries the next attempt; the
one machine whose create wins takes over. Each poll reads two objects: the
next manifest and the lease.

Defaults: a 60 s lease (``$TSC_REMOTE_LEASE_TTL``), a heartbeat every 10 s
(a sixth of the lease), polls jittered between 0.5 and 5 s.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import StoreLockedError
from .documents import check_document, document
from .objects import Objects, new_token

__all__ = ["Lease", "LeaseTimes", "acquire", "monotonic", "stage"]

#: The environment variable overriding the lease time (seconds).
LEASE_TTL_ENV = "TSC_REMOTE_LEASE_TTL"

# Test-only hooks, read once at import (unset: no effect).
# TSC_TEST_CLOCK_SKEW: seconds added to every reading of this process's monotonic clock.
_SKEW = float(os.environ.get("TSC_TEST_CLOCK_SKEW") or 0)
# TSC_TEST_CLUSTER_STOP="<stage>:<KILL|STOP>": the holder signals itself at that stage.
_STOP = os.environ.get("TSC_TEST_CLUSTER_STOP", "")


def monotonic() -> float:
    """This process's monotonic clock (the only clock a lease is judged by)."""
    return time.monotonic() + _SKEW


def stage(name: str) -> None:
    """Mark a stage of a holder's work (``leased``, ``built``, ``uploaded``, ``committed``);
    a no-op unless the test hook names it."""
    where, _, how = _STOP.partition(":")
    if where == name:
        os.kill(os.getpid(), signal.SIGSTOP if how == "STOP" else signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class LeaseTimes:
    """How long a lease lasts without a heartbeat, and how often its holder and waiters act."""

    ttl: float = 60.0
    heartbeat: float = 10.0
    poll_min: float = 0.5
    poll_max: float = 5.0

    @classmethod
    def from_env(cls) -> LeaseTimes:
        """The defaults, with the lease time of ``$TSC_REMOTE_LEASE_TTL`` if set.

        Raises
        ------
        ValueError
            If the variable is not a positive number.
        """
        raw = os.environ.get(LEASE_TTL_ENV, "").strip()
        if not raw:
            return cls()
        try:
            ttl = float(raw)
        except ValueError:
            ttl = -1.0
        if not ttl > 0:
            raise ValueError(f"${LEASE_TTL_ENV}={raw!r} is not a positive number of seconds")
        return cls(ttl=ttl, heartbeat=ttl / 6, poll_min=min(0.5, ttl / 10),
                   poll_max=min(5.0, ttl / 3))

    def poll(self) -> float:
        """A jittered pause between two polls."""
        return random.uniform(self.poll_min, self.poll_max)


def lease_name(prefix: str, gen: int, attempt: int) -> str:
    return f"{prefix}/g{gen:08d}.a{attempt:04d}.json"


@dataclass(eq=False)
class Lease:
    """A lease this process holds, heart-beaten by a thread until :meth:`release`."""

    objects: Objects
    rel: str
    token: str
    times: LeaseTimes
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Lease:
        self._thread = threading.Thread(target=self._beat, daemon=True, name="tsc-lease")
        self._thread.start()
        return self

    def _body(self, beats: int, state: str) -> dict[str, object]:
        return document("lease", {"beats": beats, "state": state, "host": socket.gethostname(),
                                  "pid": os.getpid(), "writer": self.token})

    def _beat(self) -> None:
        beats = 0
        while not self._stop.wait(self.times.heartbeat):
            beats += 1
            # a missed beat: waiters may take over, which is only duplicate work
            with contextlib.suppress(OSError):
                self.objects.write(self.rel, self._body(beats, "held"))

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (never deleted: a deleted name
        would be free to create again)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(OSError):  # else the waiters take over after a lease time
            self.objects.write(self.rel, self._body(-1, "released"))


def acquire(
    objects: Objects,
    prefix: str,
    gen: int,
    committed: Callable[[], bool],
    times: LeaseTimes,
    deadline: float | None,
) -> Lease | None:
    """Hold the lease to build on generation ``gen``, or wait until it is not needed.

    The leases are objects under ``prefix``. Returns the lease once this process holds it, or None as soon as
    ``committed()`` says that generation ``gen + 1`` exists (someone built).
    ``deadline`` (on :func:`monotonic`) bounds the wait.

    Raises
    ------
    StoreLockedError
        If ``deadline`` passes first.
    """
    attempt = 0
    while True:
        rel = lease_name(prefix, gen, attempt)
        token = new_token()
        lease = Lease(objects, rel, token, times)
        if objects.create(rel, lease._body(0, "held"), token):
            return lease.start()
        if _watch(objects, rel, committed, times, deadline):
            return None
        attempt += 1  # released without a commit, or silent for a lease time: take over


def _watch(
    objects: Objects, rel: str, committed: Callable[[], bool], times: LeaseTimes,
    deadline: float | None,
) -> bool:
    """Watch another's lease: True once the next generation is committed, False once the
    lease is released or silent for ``times.ttl`` on this process's clock."""
    last: dict[str, object] | None = None  # read at the first poll (the create read it back)
    changed = monotonic()
    while True:
        if last is not None and last.get("state") == "released":
            return committed()
        now = monotonic()
        if now - changed >= times.ttl:
            return committed()
        if deadline is not None and now >= deadline:
            raise StoreLockedError(
                f"{objects.where(rel)} is held by another machine "
                f"({(last or {}).get('host', '?')}, pid {(last or {}).get('pid', '?')}) and "
                "lock_timeout has passed; its results will be there when it commits"
            )
        pause = times.poll()
        if deadline is not None:
            pause = max(0.0, min(pause, deadline - now))
        time.sleep(pause)
        if committed():
            return True
        seen = objects.read_json(rel)
        if seen is not None:
            check_document(seen, "lease", objects.where(rel))
        if seen != last:
            last, changed = seen, monotonic()
