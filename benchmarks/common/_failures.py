"""Why an agent process ended early: watch it, then say what happened, as a result.

A :class:`Watch` follows the processes of one round: it samples their memory several
times a second (:func:`benchmarks.common._memory.sample`), and remembers where the kernel's
log and its count of OOM kills stood when the round began. When a process dies,
:meth:`Watch.failure` turns its exit status and that evidence into a record (a plain
dict, stored as is in the results):

``status``
    ``"killed"`` (ended by a signal the driver did not send), ``"error"`` (raised, or
    exited without its results) or ``"timeout"`` (stopped by the driver past the
    agent time limit); :func:`skipped` records ``"skipped"``.
``cause``
    ``"out of memory"`` when the kernel's OOM killer is known to have killed it: its
    log names the pid, or, where the log cannot be read (``/dev/kmsg`` needs
    privileges on many systems), the process got SIGKILL from no one else and the
    kernel's ``oom_kill`` count (``/proc/vmstat``) rose during the round. Otherwise the
    signal (``"SIGSEGV"``), the exception's last line, or the time limit.
``text``
    one line for the table: ``"killed: out of memory at 8.2 GB"``.

plus ``signal``, ``exitcode``, ``pid``, ``agent`` (its index in the round), ``role``,
``waiting_for`` (the step the driver was waiting for), ``elapsed_s`` (since the round
began), ``last_memory`` / ``peak_memory`` (sampled bytes: ``rss``, ``anon``,
``peak_rss``), ``evidence`` (the lines the cause rests on), ``kernel_log`` (read, or
why not) and ``error`` (the traceback, for ``"error"``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from typing import Any

from benchmarks.common._memory import gb, sample

SAMPLE_EVERY_S = 0.25
PRIVATE_EVERY = 4  # USS and PSS (a walk of the page tables) every 4th sample: once a second
KMSG = "/dev/kmsg"
_KILLED = re.compile(r"Killed process (\d+) \((.*?)\).*?anon-rss:\s*(\d+)kB")


def signal_name(number: int) -> str:
    """``"SIGKILL"`` for 9; ``"signal 77"`` for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None: unknown)."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def parse_oom_kill(record: str) -> dict[str, Any] | None:
    """The OOM killer's report in one kernel log record, or None.

    ``record`` is a line of ``/dev/kmsg`` (``"3,1234,5678,-;Out of memory: Killed process
    4321 (python) total-vm:..., anon-rss:8056000kB, ..."``) or of ``dmesg``. Returns
    ``{"pid", "name", "anon_rss" (bytes), "line"}``.
    """
    message = record.split(";", 1)[-1].split("\n", 1)[0].strip()
    match = _KILLED.search(message)
    if not match:
        return None
    return {"pid": int(match.group(1)), "name": match.group(2),
            "anon_rss": int(match.group(3)) * 1024, "line": message}


class KernelLog:
    """The kernel's log from the moment this object is made, read for OOM kills.

    Reads ``/dev/kmsg`` without blocking. Where it cannot be opened (no privilege,
    not Linux), :attr:`error` says why and :meth:`oom_kills` returns nothing.
    """

    def __init__(self) -> None:
        self.error: str | None = None
        self._fd: int | None = None
        self._kills: dict[int, dict[str, Any]] = {}
        try:
            fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self.error = f"{KMSG} not readable ({type(exc).__name__}: {exc.strerror or exc})"
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            os.close(fd)
            self.error = f"{KMSG} not seekable ({type(exc).__name__}: {exc.strerror or exc})"
            return
        self._fd = fd

    @property
    def readable(self) -> bool:
        return self._fd is not None

    def oom_kills(self) -> dict[int, dict[str, Any]]:
        """``{pid: {"line": ..., "anon_rss": bytes, "name": ...}}`` of the OOM kills
        logged since this object was made."""
        if self._fd is None:
            return self._kills
        while True:
            try:
                record = os.read(self._fd, 16384)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten before we read them
                continue
            except OSError as exc:
                self.error = f"{KMSG} read failed ({type(exc).__name__}: {exc.strerror or exc})"
                break
            if not record:
                break
            kill = parse_oom_kill(record.decode("utf-8", "replace"))
            if kill:
                self._kills[kill["pid"]] = kill
        return self._kills

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def classify(
    exitcode: int | None, *, error: str | None = None, timeout_s: float | None = None,
    oom_logged: bool = False, oom_count_rose: bool | None = None,
) -> tuple[str, str]:
    """``(status, cause)`` of a process that ended early.

    ``exitcode`` as :class:`multiprocessing.Process` and :class:`subprocess.Popen` give it
    (``-N``: ended by signal N); ``error``: its traceback, if it reported one;
    ``timeout_s``: the driver stopped it past this limit; ``oom_logged``: the kernel's
    log names it as an OOM kill; ``oom_count_rose``: the kernel's OOM kill count rose
    while it ran (None: unknown).
    """
    if timeout_s is not None:
        return "timeout", f"past the {timeout_s:g} s agent timeout"
    if error:
        lines = [ln for ln in error.strip().splitlines() if ln.strip()]
        return "error", lines[-1].strip() if lines else "raised"
    if exitcode is not None and exitcode < 0:
        if oom_logged or (-exitcode == signal.SIGKILL and oom_count_rose):
            return "killed", "out of memory"
        return "killed", signal_name(-exitcode)
    if exitcode:
        return "error", f"exited with status {exitcode}"
    return "error", "exited without sending its results"


def failure_text(status: str, cause: str, memory_bytes: int | None) -> str:
    """One line for the table: ``killed: out of memory at 8.2 GB``."""
    at = f" at {gb(memory_bytes)}" if memory_bytes else ""
    if status == "killed":
        return f"killed: {cause}{at}" if cause == "out of memory" else f"killed by {cause}{at}"
    if status == "timeout":
        return f"timeout: {cause}{at}"
    return f"{status}: {cause if len(cause) <= 80 else cause[:77] + '...'}"


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    """The record of a round that was not run (``reason`` starts the table's text)."""
    return {"status": "skipped", "cause": reason, "text": f"skipped: {reason}", **extra}


def driver_error(step: str, exc: BaseException) -> dict[str, Any]:
    """The record of a step that failed in the driver itself (preparing a method...)."""
    import traceback

    cause = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return {"status": "error", "cause": cause, "text": f"error: {cause}", "waiting_for": step,
            "role": "driver", "error": "".join(traceback.format_exception(exc))}


class Watch:
    """Memory samples and kill evidence for the processes of one round."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self.t0 = time.monotonic()
        self.kernel = KernelLog()
        self.oom_count_at_start = oom_kill_count()
        self.last: dict[int, dict[str, Any]] = {}
        self.peak: dict[int, dict[str, int]] = {}
        self._pids: list[int] = []
        self._next = 0.0
        self._ticks = 0

    def add(self, pid: int) -> None:
        self._pids.append(pid)
        self.tick(force=True)

    def tick(self, *, force: bool = False) -> None:
        """Sample every watched process, at most every ``every_s`` unless ``force``."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every_s
        private = self._ticks % PRIVATE_EVERY == 0
        self._ticks += 1
        for pid in self._pids:
            mem = sample(pid, private=private)
            if mem is None:
                continue
            at = round(now - self.t0, 3)
            # USS/PSS of the last private sample are kept (with their time) in between
            old = self.last.get(pid, {})
            kept: dict[str, Any] = {k: old[k] for k in ("uss", "pss", "private_at_s") if k in old}
            self.last[pid] = {**kept, **mem, "at_s": at}
            if private and "uss" in mem:
                self.last[pid]["private_at_s"] = at
            peak = self.peak.setdefault(pid, {})
            for key, value in mem.items():
                peak[key] = max(value, peak.get(key, 0))

    def note(self, pid: int, mem: dict[str, int]) -> None:
        """Add an exact reading (:func:`benchmarks.common._memory.memory_of`) to the samples."""
        at = round(time.monotonic() - self.t0, 3)
        self.last[pid] = dict(self.last.get(pid, {}), **mem, at_s=at, private_at_s=at)
        peak = self.peak.setdefault(pid, {})
        for key, value in mem.items():
            peak[key] = max(value, peak.get(key, 0))

    def failure(
        self, pid: int, exitcode: int | None, *, agent: int, role: str, waiting_for: str,
        error: str | None = None, timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """The record of process ``pid``, which ended early (see the module docstring)."""
        elapsed = time.monotonic() - self.t0
        kills = self.kernel.oom_kills()
        if pid not in kills and self.kernel.readable and exitcode == -signal.SIGKILL:
            time.sleep(0.2)  # the kernel logs the kill as it sends it; give it a moment
            kills = self.kernel.oom_kills()
        now_count = oom_kill_count()
        rose = (None if now_count is None or self.oom_count_at_start is None
                else now_count - self.oom_count_at_start)
        logged = kills.get(pid)
        status, cause = classify(exitcode, error=error, timeout_s=timeout_s,
                                 oom_logged=logged is not None,
                                 oom_count_rose=None if self.kernel.readable else
                                 (rose > 0 if rose is not None else None))
        last = self.last.get(pid)
        evidence: list[str] = []
        if exitcode is not None and exitcode < 0:
            evidence.append(f"exit status {exitcode} ({signal_name(-exitcode)}), "
                            f"not sent by the driver" if timeout_s is None else
                            f"exit status {exitcode} ({signal_name(-exitcode)}) after the "
                            f"driver stopped it")
        if logged:
            evidence.append(f"kernel log: {logged['line']}")
        elif self.kernel.readable and status == "killed":
            evidence.append("kernel log: no OOM kill of this pid")
        if rose is not None and status == "killed" and (rose or not self.kernel.readable):
            evidence.append(f"oom_kill in /proc/vmstat rose by {rose} during the round")
        if last:
            evidence.append(f"last memory sample {elapsed - last['at_s']:.2f} s before the end: "
                            + ", ".join(f"{k} {gb(v)}" for k, v in last.items()
                                        if not k.endswith("at_s")))
        memory = logged["anon_rss"] if logged else _memory_figure(last)
        record: dict[str, Any] = {
            "status": status, "cause": cause,
            "text": failure_text(status, cause, memory if status != "error" else None),
            "agent": agent, "role": role, "pid": pid, "exitcode": exitcode,
            "signal": signal_name(-exitcode) if exitcode is not None and exitcode < 0 else None,
            "waiting_for": waiting_for, "elapsed_s": round(elapsed, 3),
            "last_memory": last, "peak_memory": self.peak.get(pid),
            "evidence": evidence,
            "kernel_log": "read" if self.kernel.readable else self.kernel.error,
        }
        if logged:
            record["kernel_anon_rss"] = logged["anon_rss"]
        if error:
            record["error"] = error
        return record

    def close(self) -> None:
        self.kernel.close()


def _memory_figure(mem: dict[str, Any] | None) -> int | None:
    """The figure a failure is reported at: anonymous memory, else RSS."""
    if not mem:
        return None
    value = mem.get("anon", mem.get("rss"))
    return int(value) if value else None
