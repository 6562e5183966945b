"""Start rounds of agent processes, synchronise them, measure memory, record failures.

A *round* is a list of jobs started together. Every agent first imports its libraries
and reports ``imported``; when all have, the driver says ``start`` to all at once, so
no agent's timed work overlaps another's interpreter start-up. Agents whose job holds
the column report ``ready``; when all have, the driver reads each process's USS and PSS
(``psutil.Process.memory_full_info``) at the same moment, then says ``go``.

While it waits, the driver samples every agent's memory several times a second
(:class:`benchmarks.common._failures.Watch`). When an agent dies (the kernel's OOM killer
included), raises, or is still running past the time limit, the driver stops the
round's other agents and raises :class:`AgentError`, whose :attr:`~AgentError.failure`
is the record the benchmark stores as that round's result.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from typing import Any, NoReturn

import psutil

from benchmarks.common._failures import Watch
from benchmarks.common._memory import memory_of
from benchmarks.run._agent import agent_main

__all__ = ["AGENT_TIMEOUT_S", "AgentError", "memory_of", "run_round", "set_start_method"]

#: default time limit of a round's agents, in seconds (``--agent-timeout``)
AGENT_TIMEOUT_S = 3600.0
#: modules a forkserver imports once, so that its agents start in milliseconds
FORKSERVER_PRELOAD = ["numpy", "PIL.Image", "pandas", "torch", "torch.utils.data", "datasets",
                      "zarr", "tensorstore_cache", "benchmarks.run._agent", "benchmarks.common.methods"]
_START_METHOD = ["spawn"]
_POLL_S = 0.05
_STOP_GRACE_S = 5.0


def set_start_method(name: str) -> None:
    """``"spawn"`` (default: every agent is a fresh interpreter, like a sweep agent) or
    ``"forkserver"`` (agents fork from a server that imported the libraries once: much
    faster to start, for smoke tests; library pages are then shared with the server)."""
    if name not in ("spawn", "forkserver"):
        raise ValueError(f"start method must be 'spawn' or 'forkserver', got {name!r}")
    if name == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    _START_METHOD[0] = name


class AgentError(RuntimeError):
    """An agent of a round was killed, raised, or ran past the time limit.

    :attr:`failure` is the round's record (see :mod:`benchmarks.common._failures`): status,
    cause, signal, last sampled memory, elapsed time, evidence and traceback.
    """

    def __init__(self, message: str, failure: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.failure: dict[str, Any] = failure or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.failure)


class _Round:
    """The processes of one round, their pipes, and what the driver has read from them."""

    def __init__(self, jobs: list[dict[str, Any]], timeout_s: float) -> None:
        self.jobs = jobs
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.watch = Watch()
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.finished = [False] * len(jobs)  # its last message ("done") was read
        self.drained = [False] * len(jobs)  # ended, and its pipe was read to the end
        self.inbox: list[deque[tuple[str, dict[str, Any]]]] = [deque() for _ in jobs]

    def start(self) -> None:
        ctx: Any = multiprocessing.get_context(_START_METHOD[0])
        for job in self.jobs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=agent_main, args=(job, child), daemon=False)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
            self.watch.add(proc.pid)

    def role(self, i: int) -> str:
        return "baseline" if "baseline" in self.jobs[i]["tasks"] else "agent"

    def recv(self, i: int, what: str) -> tuple[str, dict[str, Any]]:
        """The next message of agent ``i``; fail the round if any agent ends early."""
        while True:
            if self.inbox[i]:
                kind, payload = self.inbox[i].popleft()
            elif self.conns[i].poll(_POLL_S):
                try:
                    kind, payload = self.conns[i].recv()
                except (EOFError, OSError):
                    self.fail(i, what)
            else:
                self.watch.tick()
                self._check_others(i, what)
                if time.monotonic() > self.deadline:
                    self.fail(i, what, timed_out=True)
                continue
            if kind == "error":
                self.fail(i, what, error=payload.get("error") or "agent reported an error")
            if kind == "done":
                self.finished[i] = True
            return kind, payload

    def _check_others(self, i: int, what: str) -> None:
        """Fail the round as soon as any agent has ended without its results."""
        for j, proc in enumerate(self.procs):
            if j == i or self.finished[j] or self.drained[j] or proc.is_alive():
                continue
            # read what it sent before it ended: its results, its error, or nothing
            while self.conns[j].poll(0):
                try:
                    self.inbox[j].append(self.conns[j].recv())
                except (EOFError, OSError):
                    break
            self.drained[j] = True
            kinds = [kind for kind, _ in self.inbox[j]]
            if "error" in kinds:
                payload = self.inbox[j][kinds.index("error")][1]
                self.fail(j, what, error=payload.get("error") or "agent reported an error")
            if "done" not in kinds:
                self.fail(j, what)

    def send(self, i: int, message: str, what: str) -> None:
        try:
            self.conns[i].send(message)
        except OSError:  # the agent died since its last message
            self.fail(i, what)

    def fail(self, i: int, what: str, *, error: str | None = None,
             timed_out: bool = False) -> NoReturn:
        """Stop the round's other agents; raise :class:`AgentError` for agent ``i``."""
        proc = self.procs[i]
        if timed_out:
            _stop(proc)
        else:
            proc.join(_STOP_GRACE_S)  # reap it: its exit status tells how it ended
        fates = {j: _fate(p) for j, p in enumerate(self.procs) if j != i}
        stopped = [j for j, p in enumerate(self.procs) if j != i and p.is_alive()]
        for j in stopped:
            _stop(self.procs[j])
        failure = self.watch.failure(
            proc.pid, proc.exitcode, agent=i, role=self.role(i), waiting_for=what,
            error=error, timeout_s=self.timeout_s if timed_out else None)
        failure["agents"] = len(self.procs)
        others = []
        for j, fate in fates.items():
            if j in stopped:
                fate = "stopped by the driver"
            elif fate == "ended early" and self.procs[j].exitcode is not None:
                other = self.watch.failure(self.procs[j].pid, self.procs[j].exitcode, agent=j,
                                           role=self.role(j), waiting_for=what)
                fate = other["text"]
            others.append({"agent": j, "role": self.role(j), "pid": self.procs[j].pid,
                           "exitcode": self.procs[j].exitcode, "fate": fate,
                           "last_memory": self.watch.last.get(self.procs[j].pid)})
        failure["others"] = others
        died = 1 + sum(1 for o in others if o["fate"].startswith(failure["status"]))
        if died > 1:
            failure["text"] += f" ({died} of {len(self.procs)} agents)"
        raise AgentError(f"agent {i} (pid {proc.pid}) {failure['text']} while the driver "
                         f"waited for {what}" + (f":\n{error}" if error else ""), failure)

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                _stop(proc)
        for conn in self.conns:
            conn.close()
        self.watch.close()


def _fate(proc: Any) -> str:
    if proc.is_alive():
        return "running"
    return "finished" if proc.exitcode == 0 else "ended early"


def _stop(proc: Any) -> None:
    """SIGTERM, then SIGKILL if it has not ended within a few seconds."""
    if proc.is_alive():
        proc.terminate()
        proc.join(_STOP_GRACE_S)
    if proc.is_alive():
        proc.kill()
        proc.join(_STOP_GRACE_S)


def run_round(
    jobs: list[dict[str, Any]],
    server_pids: list[int] | None = None,
    timeout_s: float = AGENT_TIMEOUT_S,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Run ``jobs`` in parallel agent processes; return their results and memory.

    Returns ``(results, memory)``: ``results[i]`` is job ``i``'s result dict, with
    ``"peak_memory"`` (the highest sampled ``rss``/``anon``/``peak_rss`` bytes) added;
    ``memory`` is ``None`` unless some job holds (``"hold"`` or ``"baseline"`` in its
    tasks), else ``{"agents": [per holding non-baseline job], "baseline": {...} or None,
    "servers": [...]}`` with ``uss``/``pss``/``rss``/``anon`` bytes each.

    Raises :class:`AgentError` (with the round's failure record) if an agent is
    killed, raises, or is still running ``timeout_s`` after the round began; the
    round's other agents are stopped first.
    """
    rnd = _Round(jobs, timeout_s)
    try:
        rnd.start()
        for i in range(len(jobs)):
            rnd.recv(i, "imports")
        for i in range(len(jobs)):
            rnd.send(i, "start", "imports")
        holding = [i for i, job in enumerate(jobs) if {"hold", "baseline"} & set(job["tasks"])]
        memory: dict[str, Any] | None = None
        if holding:
            for i in holding:
                rnd.recv(i, "ready")
            agents: list[dict[str, int]] = []
            memory = {"agents": agents, "baseline": None, "servers": []}
            for i in holding:
                try:
                    mem = memory_of(rnd.procs[i].pid)
                except psutil.NoSuchProcess:  # died (or is a zombie) since it said ready
                    rnd.fail(i, "ready")
                rnd.watch.note(rnd.procs[i].pid, mem)
                if "baseline" in jobs[i]["tasks"]:
                    memory["baseline"] = mem
                else:
                    agents.append(mem)
            try:
                memory["servers"] = [memory_of(pid) for pid in server_pids or []]
            except psutil.NoSuchProcess as exc:
                cause = f"server process {exc.pid} (a manager) is gone"
                raise AgentError(cause, {"status": "error", "cause": cause, "role": "server",
                                         "text": f"error: {cause}", "waiting_for": "ready",
                                         "pid": exc.pid}) from None
            for i in holding:
                rnd.send(i, "go", "results")
        results = []
        for i in range(len(jobs)):
            _kind, payload = rnd.recv(i, "results")
            results.append(payload)
        rnd.watch.tick(force=True)
        for proc, payload in zip(rnd.procs, results, strict=True):
            payload["peak_memory"] = rnd.watch.peak.get(proc.pid)
            proc.join(timeout=max(1.0, rnd.deadline - time.monotonic()))
        return results, memory
    finally:
        rnd.close()
