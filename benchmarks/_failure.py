"""Why a benchmark process ended: finished, raised, killed (by the OOM killer or not), timed out.

A process that dies is a result of the method it ran, not a crash of the benchmark.
:func:`classify` turns what the parent saw (the exit status, whether it had to stop the
process for running too long, the kernel's OOM kills, the last memory sample) into an
:class:`Outcome` with a short text for a table cell, e.g. ``"killed: out of memory at
8.2 GB"``.

Out-of-memory kills are recognised from the kernel's own record when it is readable
(``dmesg``: ``Out of memory: Killed process PID (...) ... anon-rss:NkB``, which names the
victim, possibly a child of the process), else from the system-wide ``oom_kill`` counter
of ``/proc/vmstat`` having moved while the process ran and it died of ``SIGKILL``.

Processes that may be killed should volunteer first: :func:`volunteer_for_oom_killer`
sets ``/proc/self/oom_score_adj`` to 1000, so under memory pressure the kernel kills them
(their children inherit the setting), never the parent or anything else on the machine.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "error", "killed", "oom", "timeout"]

_VICTIM = re.compile(r"Killed process (\d+) \(([^)]*)\).*?anon-rss:(\d+)kB")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one process ended."""

    #: ``"ok"``, ``"error"`` (raised / non-zero exit), ``"killed"`` (a signal),
    #: ``"oom"`` (killed by the kernel's OOM killer) or ``"timeout"``
    status: Status
    #: one line for a table cell
    text: str
    exit_code: int | None = None
    #: name of the signal that ended the process (``"SIGKILL"``), if one did
    signal: str | None = None
    #: the process's (or its child's) memory when it died, in bytes, if known:
    #: the kernel's anon-rss of an OOM victim, else the last sample taken
    memory_bytes: int | None = None
    #: pid the OOM killer chose (the process itself or one of its children)
    oom_victim: int | None = None
    elapsed_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def volunteer_for_oom_killer() -> None:
    """Make this process (and the children it starts) the OOM killer's first choice."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills since boot (``/proc/vmstat``), or None."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def oom_victims() -> dict[int, int]:
    """``{pid: anon-rss bytes}`` of the processes the OOM killer killed, from ``dmesg``.

    Empty when the kernel log cannot be read (it often needs privileges).
    """
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {int(m[1]): int(m[3]) * 1024 for m in _VICTIM.finditer(out)}


def gigabytes(n: int | float) -> str:
    """``8.2 GB`` (decimal units, one decimal; MB below 1 GB)."""
    if n < 1e9:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e9:.1f} GB"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def classify(
    returncode: int | None,
    *,
    timed_out: bool = False,
    pids: set[int] | frozenset[int] = frozenset(),
    oom_kills_before: int | None = None,
    oom_kills_after: int | None = None,
    victims: dict[int, int] | None = None,
    last_memory_bytes: int | None = None,
    elapsed_s: float | None = None,
    error: str | None = None,
) -> Outcome:
    """Describe how a process ended.

    Parameters
    ----------
    returncode
        Its exit status as ``subprocess`` reports it (negative: killed by that signal).
    timed_out
        True if the parent stopped it for running past its time limit.
    pids
        The process's pid and those of the children it was seen with; an OOM kill of
        any of them counts (a child killed for memory usually makes the parent fail).
    oom_kills_before, oom_kills_after
        :func:`oom_kill_count` when it started and when it ended.
    victims
        :func:`oom_victims` read after it ended (None: read it here if needed).
    last_memory_bytes
        The last memory sample of the process and its children.
    elapsed_s
        How long it ran.
    error
        What the process reported about its failure (the last line of a traceback).
    """
    common: dict[str, Any] = {"exit_code": returncode, "elapsed_s": elapsed_s}
    if timed_out:
        return Outcome("timeout", f"timed out after {elapsed_s or 0:.0f} s",
                       memory_bytes=last_memory_bytes, **common)
    if returncode == 0 and error is None:
        return Outcome("ok", "ok", **common)
    sig = signal_name(-returncode) if returncode is not None and returncode < 0 else None
    counter_moved = (oom_kills_before is not None and oom_kills_after is not None
                     and oom_kills_after > oom_kills_before)
    if victims is None and (counter_moved or sig == "SIGKILL"):
        victims = oom_victims()
    hit = sorted(pid for pid in (victims or {}) if pid in pids)
    if hit or (sig == "SIGKILL" and counter_moved):
        memory = (victims or {}).get(hit[0]) if hit else None
        memory = memory if memory is not None else last_memory_bytes
        at = f" at {gigabytes(memory)}" if memory else ""
        return Outcome("oom", f"killed: out of memory{at}", signal=sig, memory_bytes=memory,
                       oom_victim=hit[0] if hit else None, **common)
    if sig is not None:
        return Outcome("killed", f"killed: {sig}", signal=sig, memory_bytes=last_memory_bytes,
                       **common)
    what = error or f"exit status {returncode}"
    return Outcome("error", f"raised: {what}"[:160], memory_bytes=last_memory_bytes, **common)
