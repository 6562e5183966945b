"""Stamped timelines: events of several processes written to one file, in seconds."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def process_started_at() -> float:
    """When this process started, in seconds since the epoch (to the kernel's clock tick:
    its start in ticks since boot against the uptime now, not the boot time in whole
    seconds that ``psutil`` adds)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Stamps:
    """Appends ``seconds-since-start pid event`` lines to a file (any process may write).

    Picklable: a worker process that receives it stamps into the same file.
    """

    def __init__(self, path: str, start: float) -> None:
        self.path, self.start = path, start

    def __call__(self, event: str, at: float | None = None, cpu: bool = False) -> None:
        """Stamp ``event`` now, or at ``at`` (seconds since the epoch); with ``cpu``, as
        ``[C] event``, C the CPU seconds (user and system) this process has used so far."""
        when = time.time() if at is None else at
        if cpu:
            event = f"[{time.process_time():.3f}] {event}"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{when - self.start:.3f} {os.getpid()} {event}\n")


#: An event line of a printed timeline, ``  0.118 s  pid 27949  cpu  0.052 s  what``: the
#: seconds since the start (negative for a process start stamped to the clock tick before
#: it), the process, the CPU seconds it had used then (optional) and the event; the lines of
#: CPU totals after the events are not event lines.
EVENT_LINE = re.compile(r"^ *(-?\d+\.\d+) s  pid (\d+)  (?:cpu +(\d+\.\d+) s  )?(.*)$", re.M)


def event_line(at: float, pid: int | str, cpu: float | str, what: str, digits: int = 3) -> str:
    """One event line of a printed timeline (:data:`EVENT_LINE`).

    Parameters
    ----------
    at
        Seconds since the timeline's start.
    pid
        The process that stamped the event.
    cpu
        The CPU seconds that process had used then.
    what
        The event.
    digits
        Decimals of both figures (in columns 7 and 6 wide).
    """
    return f"{at:7.{digits}f} s  pid {pid}  cpu {float(cpu):6.{digits}f} s  {what}"


def event_lines(text: str) -> list[tuple[float, int, float | None, str]]:
    """The event lines of ``text`` (:data:`EVENT_LINE`).

    Parameters
    ----------
    text
        A printed timeline (other lines are skipped).

    Returns
    -------
    list of tuple
        ``(seconds, pid, CPU seconds or None, event)`` of every event line, in order.
    """
    return [(float(t), int(pid), float(cpu) if cpu else None, what)
            for t, pid, cpu, what in EVENT_LINE.findall(text)]


def caller(events: Sequence[tuple[Any, ...]], call: str = "call") -> int:
    """The process that stamped ``call``: the timeline's calling process.

    Not the first event's: a worker's start is stamped to the kernel's clock tick (10 ms),
    so it may be shown before the call that started it, even below 0 s.

    Parameters
    ----------
    events
        Events as :func:`event_lines` gives them (or with fewer fields): the pid second,
        the event last.
    call
        The calling process's first event.

    Raises
    ------
    ValueError
        If no event is ``call``.
    """
    for event in events:
        if event[-1] == call:
            return int(event[1])
    raise ValueError(f"no {call!r} event in this timeline: {[e[-1] for e in events][:20]}")
