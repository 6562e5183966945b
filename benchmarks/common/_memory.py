"""Memory of agent processes and of the machine, and the guard of a round of K agents.

- :func:`memory_of`: USS, PSS, RSS and anonymous memory of a live process (exact,
  walks its page tables: taken once per round, when every agent holds its column).
- :func:`sample`: RSS, anonymous memory and peak RSS from ``/proc/PID/status``, cheap
  enough to read several times a second while agents work, so that the last memory of
  an agent the kernel killed is known.
- :func:`available_memory`: what a round may still allocate: ``MemAvailable``, or less
  if this process's cgroup has a lower limit.
- :func:`estimate_round` and :func:`guard`: whether a round of K agents fits, from the
  memory one agent used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

#: fields of /proc/PID/status read by :func:`sample`, in kB
_STATUS_FIELDS = {"VmRSS:": "rss", "RssAnon:": "anon", "VmHWM:": "peak_rss"}
#: fields of /proc/PID/smaps_rollup whose sum is the USS (as psutil counts it)
_PRIVATE_FIELDS = ("Private_Clean", "Private_Dirty", "Private_Hugetlb")
_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a huge number


def gb(nbytes: float) -> str:
    """``nbytes`` in GB (10^9 bytes) with one decimal: ``"8.2 GB"``."""
    return f"{nbytes / 1e9:.1f} GB"


def memory_of(pid: int) -> dict[str, int]:
    """USS, PSS, RSS and anonymous memory of a live process, in bytes.

    USS counts every page mapped by this process only, file pages included: one
    process reading a memory-mapped file has those page-cache pages in its USS until a
    second process maps them too. ``anon`` (from ``/proc/PID/smaps_rollup``) counts only
    anonymous memory (heap, copies), which no other process can share.
    """
    info = psutil.Process(pid).memory_full_info()
    out = {"uss": int(info.uss), "pss": int(info.pss), "rss": int(info.rss)}
    anon = (rollup(pid) or {}).get("Anonymous")
    if anon is not None:
        out["anon"] = anon
    return out


def rollup(pid: int | str) -> dict[str, int] | None:
    """Every size of ``/proc/PID/smaps_rollup`` (``pid`` may be ``"self"``) by name, in
    bytes: a walk of the process's page tables, a few milliseconds for gigabytes (None:
    unreadable, or not Linux)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            fields[parts[0][:-1]] = int(parts[1]) * 1024
    return fields


def sample(pid: int, *, private: bool = False) -> dict[str, int] | None:
    """RSS, anonymous memory (``anon``) and peak RSS of ``pid`` in bytes; None if gone.

    Read from ``/proc/PID/status``: counters the kernel keeps, so reading them costs
    microseconds whatever the process's size. With ``private``, also ``uss`` and ``pss``
    from ``/proc/PID/smaps_rollup`` (a walk of the page tables: a few milliseconds for
    gigabytes). Elsewhere than Linux, RSS only (psutil).
    """
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            return {"rss": int(psutil.Process(pid).memory_info().rss)}
        except psutil.Error:
            return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        key = _STATUS_FIELDS.get(line.split(" ", 1)[0].split("\t", 1)[0])
        if key:
            out[key] = int(line.split()[1]) * 1024
    if private and out:
        fields = rollup(pid)
        if fields is None:
            return out
        out["uss"] = sum(fields.get(k, 0) for k in _PRIVATE_FIELDS)
        if "Pss" in fields:
            out["pss"] = fields["Pss"]
    return out or None


def _cgroup_headroom() -> tuple[int, str] | None:
    """Bytes this process's memory cgroup may still charge, and the limit file; None
    if there is no limit (or it cannot be read)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup", rel)
            files = (base / "memory.max", base / "memory.current")
        elif "memory" in controllers.split(","):  # cgroup v1
            base = Path("/sys/fs/cgroup/memory", rel)
            files = (base / "memory.limit_in_bytes", base / "memory.usage_in_bytes")
        else:
            continue
        try:
            limit_text = files[0].read_text().strip()
            if limit_text == "max" or int(limit_text) >= _UNLIMITED:
                continue
            used = int(files[1].read_text().strip())
        except (OSError, ValueError):
            continue
        return max(0, int(limit_text) - used), str(files[0])
    return None


def available_memory() -> tuple[int, str]:
    """Bytes new processes may allocate now, and where that figure comes from.

    ``MemAvailable`` of ``/proc/meminfo`` (free memory plus the page cache the kernel
    can drop), or the headroom under this process's memory cgroup limit if smaller.
    """
    available = int(psutil.virtual_memory().available)
    source = "MemAvailable"
    cgroup = _cgroup_headroom()
    if cgroup is not None and cgroup[0] < available:
        available, source = cgroup[0], f"cgroup limit ({cgroup[1]})"
    return available, source


def estimate_round(agent_bytes: int, baseline_bytes: int, k: int) -> int:
    """Memory a round of ``k`` agents and one baseline agent needs, in bytes.

    ``agent_bytes`` is the peak anonymous memory one agent of the same job reached
    alone (its imports included), ``baseline_bytes`` a baseline agent's: K private
    copies of what one agent held. Page-cache pages of memory-mapped files are shared
    and reclaimable, so they are not counted.
    """
    if k < 1 or agent_bytes < 0 or baseline_bytes < 0:
        raise ValueError(f"need k >= 1 and byte counts >= 0, got k={k}, "
                         f"agent_bytes={agent_bytes}, baseline_bytes={baseline_bytes}")
    return k * agent_bytes + baseline_bytes


@dataclass(frozen=True, slots=True)
class GuardDecision:
    """Whether a round runs, and why."""

    #: True: start the round
    run: bool
    #: estimated bytes the round needs
    need_bytes: int
    #: bytes available before the round
    available_bytes: int
    #: the estimate exceeds what is available (the round runs only if OOM is allowed)
    over: bool
    #: one line for the log and the report
    text: str


def guard(need_bytes: int, available_bytes: int, *, allow_oom: bool) -> GuardDecision:
    """Decide whether a round estimated at ``need_bytes`` may run.

    It runs when it fits in ``available_bytes``; otherwise only with ``allow_oom``
    (its agents, which ask the kernel to kill them first, are then expected to be
    killed), and is recorded as skipped without it.
    """
    over = need_bytes > available_bytes
    need, avail = gb(need_bytes), gb(available_bytes)
    if not over:
        text = f"estimated {need} of {avail} available"
    elif allow_oom:
        text = f"run with --allow-oom: would need about {need} of {avail} available"
    else:
        text = f"skipped: would need about {need} of {avail} available"
    return GuardDecision(run=allow_oom or not over, need_bytes=need_bytes,
                         available_bytes=available_bytes, over=over, text=text)


def set_oom_score_adj(value: int = 1000) -> bool:
    """Ask the kernel to pick this process first when it runs out of memory.

    ``/proc/self/oom_score_adj`` = 1000 makes an agent the OOM killer's first choice,
    ahead of the driver or anything else on the machine (raising it needs no
    privilege). Returns False where it cannot be set.
    """
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as f:
            f.write(str(value))
    except OSError:
        return False
    return True
