"""The soak's killer (:mod:`tests.support.soak`): SIGKILLs on a schedule, at random times.

The kinds of kill come in a fixed order, again and again (:data:`SCHEDULE`): a caller
mid-build (its build directory exists in the cache, or its pool worker does), a pool worker
of a build, gc, and a caller whatever it is doing. Between two kills the killer waits a
random time; a kind whose target does not exist yet (no build running) waits until one does,
so every kind is killed in turn, in a short run as in a long one, and the run can assert
each happened.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

__all__ = ["SCHEDULE", "Killer", "building_pids", "pool_workers"]

#: the kinds of kill, in the order the killer takes them
SCHEDULE = ("builder", "worker", "gc", "caller")


class _Process(Protocol):
    """What the killer needs of a process of the soak."""

    name: str
    role: str
    pid: int

    def running(self) -> bool: ...


def pool_workers(pid: int) -> list[psutil.Process]:
    """The pool worker processes of the caller ``pid`` (:mod:`tensorstore_cache.writer.procs`)."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    out = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if "tensorstore_cache.writer.procs" in " ".join(child.cmdline()):
                out.append(child)
    return out


def building_pids(cache: Path) -> set[int]:
    """Pids named by the build directories in the cache's namespaces
    (``.<part>.tsc-build-<host>-<pid>-<r>``)."""
    pids = set()
    for parts in cache.glob("*/parts"):
        with contextlib.suppress(OSError):
            for name in os.listdir(parts):
                if name.startswith(".") and ".tsc-build-" in name:
                    bits = name.split(".tsc-build-", 1)[1].split("-")
                    if len(bits) >= 2 and bits[1].isdigit():
                        pids.add(int(bits[1]))
    return pids


class Killer:
    """Takes the kinds of :data:`SCHEDULE` in turn (``gc`` left out when there is no gc
    loop), each after a random pause in ``kill_every``; ``kill(kind, target, **info)``
    does the killing and records it."""

    def __init__(self, rng: random.Random, kill_every: tuple[float, float], cache: Path,
                 gc: bool, start: float) -> None:
        self.rng, self.kill_every, self.cache = rng, kill_every, cache
        self.kinds = [k for k in SCHEDULE if gc or k != "gc"]
        self.turn = 0
        self.next_kill = start + rng.uniform(*kill_every)

    @property
    def pending(self) -> str:
        """The kind of the next kill."""
        return self.kinds[self.turn % len(self.kinds)]

    def step(self, now: float, procs: Sequence[_Process],
             kill: Callable[..., bool]) -> None:
        """Kill the pending kind's target if it is time and there is one."""
        if now < self.next_kill:
            return
        callers = [p for p in procs if p.role == "caller" and p.running()]
        if self._kill(self.pending, callers, procs, kill):
            self.turn += 1
            self.next_kill = now + self.rng.uniform(*self.kill_every)

    def _kill(self, kind: str, callers: list[Any], procs: Sequence[_Process],
              kill: Callable[..., bool]) -> bool:
        if kind == "worker":
            workers = [(c, w) for c in callers for w in pool_workers(c.pid)]
            if not workers:
                return False
            owner, worker = self.rng.choice(workers)
            return kill("worker", worker, owner=owner.pid, caller=owner.name)
        if kind == "gc":
            live = [p for p in procs if p.role == "gc" and p.running()]
            return bool(live) and kill("gc", live[0])
        building = building_pids(self.cache)
        mid = [c for c in callers if c.pid in building or pool_workers(c.pid)]
        if kind == "builder":
            if not mid:
                return False
            victim = self.rng.choice(mid)
        elif not callers:
            return False
        else:
            victim = self.rng.choice(callers)
        return kill(kind, victim, caller=victim.name, mid_build=victim in mid)
