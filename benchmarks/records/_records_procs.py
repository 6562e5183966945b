"""Run the phases of the records benchmark, each in a process of its method's environment.

:meth:`Runner.run` starts ``python -m benchmarks.records.records_methods._child JOB`` with the
interpreter of the method's environment and waits for it, sampling its memory
(:class:`benchmarks.common._failures.Watch`); :meth:`Runner.hold_round` starts K readers and a
baseline process together and reads their memory while all of them hold the store.

What a phase gives back is its result (``status: "ok"``) or a failure record in the
house format (:mod:`benchmarks.common._failures`): ``status`` (``error``, ``killed``,
``timeout``, ``not installed``), ``cause``, ``text`` for the table, and the evidence
(traceback, the tail of the process's log, last memory sample).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common._failures import Watch
from benchmarks.common._memory import memory_of
from benchmarks.records.records_methods import METHODS

POLL_S = 0.05
STOP_GRACE_S = 5.0
LOG_TAIL = 3000


def child_env(repo: Path, workdir: Path) -> dict[str, str]:
    """The environment of every phase: the repository importable, no progress bars,
    no network look-ups, the peers' caches and temporary files inside the work directory."""
    env = dict(os.environ)
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH")) if p)
    env.update({
        "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_CACHE": str(workdir / "hf-cache"),
        "LITDATA_DISABLE_VERSION_CHECK": "1", "LITDATA_CACHE_DIR": str(workdir / "litdata-cache"),
    })
    return env


def not_installed(cause: str, **extra: Any) -> dict[str, Any]:
    """The record of a method whose environment or libraries are missing."""
    return {"status": "not installed", "cause": cause, "text": f"not installed: {cause}", **extra}


@dataclass
class Runner:
    """Starts phases of methods; one per benchmark run."""

    repo: Path
    workdir: Path
    #: environment name -> virtual environment directory (``project`` is this interpreter)
    venvs: dict[str, Path]
    timeout_s: float
    _env: dict[str, str] = field(default_factory=dict)
    _count: int = 0

    def __post_init__(self) -> None:
        self.jobs = self.workdir / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)
        self._env = child_env(self.repo, self.workdir)

    def interpreter(self, method: str) -> Path | dict[str, Any]:
        """The method's Python, or the record saying why there is none."""
        env = METHODS[method].env
        if env == "project":
            return Path(sys.executable)
        venv = self.venvs[env]
        python = venv / "bin" / "python"
        if python.exists():
            return python
        cause = f"no environment at {venv} (`make peers` creates it)"
        log = Path(f"{venv}.log")
        extra = {"log_tail": log.read_text(errors="replace")[-LOG_TAIL:]} if log.exists() else {}
        return not_installed(cause, **extra)

    def _start(self, method: str, phase: str, job: dict[str, Any],
               python: Path) -> tuple[subprocess.Popen[bytes], Path, Path, dict[str, Any]]:
        self._count += 1
        stem = self.jobs / f"{self._count:04d}-{method}-{phase}"
        result = Path(f"{stem}.result.json")
        result.unlink(missing_ok=True)
        full = {**job, "method": method, "phase": phase, "result": str(result)}
        Path(f"{stem}.json").write_text(json.dumps(full), encoding="utf-8")
        log = Path(f"{stem}.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(python), "-m", "benchmarks.records.records_methods._child", f"{stem}.json"],
                cwd=self.repo, env=self._env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT)
        return proc, result, log, full

    def _outcome(self, proc: subprocess.Popen[bytes], result: Path, log: Path, watch: Watch,
                 *, phase: str, agent: int = 0, timed_out: bool = False) -> dict[str, Any]:
        try:
            res: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            res = {}
        tail = log.read_text(errors="replace")[-LOG_TAIL:] if log.exists() else ""
        if not timed_out and proc.returncode == 0 and res.get("status") == "ok":
            return res
        if not timed_out and res.get("status") == "not installed":
            return not_installed(res["cause"], error=res.get("error"), log_tail=tail,
                                 python=res.get("python"), versions=res.get("versions"))
        record = watch.failure(proc.pid, proc.returncode, agent=agent, role=phase,
                               waiting_for=phase, error=res.get("error"),
                               timeout_s=self.timeout_s if timed_out else None)
        record.update(log_tail=tail, python=res.get("python"), versions=res.get("versions"))
        return record

    def run(self, method: str, phase: str, job: dict[str, Any]) -> dict[str, Any]:
        """Run one phase to its end; its result or its failure record."""
        python = self.interpreter(method)
        if isinstance(python, dict):
            return python
        proc, result, log, _ = self._start(method, phase, job, python)
        watch = Watch()
        watch.add(proc.pid)
        deadline = time.monotonic() + self.timeout_s
        timed_out = False
        try:
            while proc.poll() is None:
                watch.tick()
                if time.monotonic() > deadline:
                    timed_out = True
                    _stop([proc])
                    break
                time.sleep(POLL_S)
            return self._outcome(proc, result, log, watch, phase=phase, timed_out=timed_out)
        finally:
            watch.close()

    def hold_round(self, method: str, job: dict[str, Any], readers: int) -> dict[str, Any]:
        """``readers`` processes that each opened the store and read every record, then a
        baseline process that imported the modules they had loaded, all alive at once:
        their memory."""
        python = self.interpreter(method)
        if isinstance(python, dict):
            return python
        release = self.jobs / f"release-{method}-{self._count}"
        release.unlink(missing_ok=True)
        procs: list[tuple[str, subprocess.Popen[bytes], Path, Path, Path]] = []
        watch = Watch()

        def start(phase: str, extra: dict[str, Any]) -> None:
            ready = self.jobs / f"ready-{method}-{self._count}-{len(procs)}"
            ready.unlink(missing_ok=True)
            proc, result, log, _ = self._start(
                method, phase, {**job, **extra, "ready": str(ready), "release": str(release),
                                "hold_timeout_s": self.timeout_s}, python)
            watch.add(proc.pid)
            procs.append((phase, proc, result, log, ready))

        def wait_ready() -> dict[str, Any] | None:
            deadline = time.monotonic() + self.timeout_s
            while not all(p[4].exists() for p in procs):
                watch.tick()
                dead = [(k, p) for k, p in enumerate(procs) if p[1].poll() is not None]
                if dead or time.monotonic() > deadline:
                    _stop([p[1] for p in procs])
                    k, (phase, proc, result, log, _r) = dead[0] if dead else (0, procs[0])
                    rec = self._outcome(proc, result, log, watch, phase=phase, agent=k,
                                        timed_out=not dead)
                    rec["round"] = f"{readers} readers"
                    return rec
                time.sleep(POLL_S)
            return None

        try:
            for _ in range(readers):
                start("hold", {})
            failed = wait_ready()
            if failed:
                return failed
            loaded = json.loads(procs[0][4].read_text(encoding="utf-8"))["modules"]
            start("baseline", {"modules": loaded})
            failed = wait_ready()
            if failed:
                return failed
            mem = [memory_of(p[1].pid) for p in procs]
        finally:
            release.write_text("go")
            for p in procs:
                try:
                    p[1].wait(timeout=STOP_GRACE_S * 6)
                except subprocess.TimeoutExpired:
                    _stop([p[1]])
            watch.close()
        results = []
        for k, (phase, proc, result, log, _r) in enumerate(procs):
            if proc.returncode != 0:
                rec = self._outcome(proc, result, log, watch, phase=phase, agent=k)
                rec["round"] = f"{readers} readers"
                return rec
            results.append(json.loads(result.read_text(encoding="utf-8")))
        base, held = mem[-1], mem[:-1]
        return {
            "status": "ok", "readers": readers, "baseline": base, "readers_memory": held,
            "uss_growth_bytes": sum(m["uss"] - base["uss"] for m in held),
            "anon_growth_bytes": sum(m.get("anon", 0) - base.get("anon", 0) for m in held),
            "pss_total_bytes": sum(m["pss"] for m in held),
            "baseline_modules": {"imported": results[-1].get("modules_imported"),
                                 "missed": results[-1].get("modules_missed")},
        }


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate, then kill, processes still running."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
    end = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, end - time.monotonic()))
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()
