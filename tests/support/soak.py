"""Soak test of the cache: real processes racing on one cache for a fixed time.

Run it as ``python -m tests.support.soak --seconds 600 [--callers 4] [--workdir D]``:
it prints a JSON report of its counts and exits with 1 if it found any
violation (``tests/test_guarantees/test_soak.py`` runs a short one in the suite).

For ``--seconds``, on one cache directory:

* callers (4 by default; spawned by ``subprocess`` and ``multiprocessing``
  spawn, one forked) call ``tsc.cached()`` on random subsets of a growing
  set of sources, half of them with ``workers=2`` (a pool worker per build),
  under two loader ids (two namespaces), and check every returned store: it
  maps every requested path (bar ``spec.skipped``), and every vector is its
  source at a version that existed and is no older than the one on disk
  when the call started (the caller reads every source before the call);
* gc runs in a loop, ``gc(older_than=0)`` and ``gc(max_bytes=small)`` in turn;
* a writer atomically rewrites sources whose content carries a version
  number and adds new ones. Most rewrites keep the size; some come in
  bursts of two, the second of the same size and, within a simulated
  timestamp tick (``--same-tick-ms``, 2 ms), with the first one's mtime,
  as a filesystem with coarse timestamps gives them: an entry cached
  between the two is racily clean. The newest sources, which every call
  asks for first (so a first build probes one), are rewritten most;
* a killer SIGKILLs on a schedule (:mod:`tests.support._soak_killer`), at
  random times: a caller mid-build (its build directory or pool worker
  exists), a pool worker, gc and a caller whatever it does, in turn, so a
  run of any length kills each kind; killed processes are started again.

A call may fail only if its own pool worker was killed during it, and then
only with :class:`~tensorstore_cache.BuildError`; every other exception is a
violation, reported with its traceback. At the end (everything stopped): a
fresh ``cached()`` of every source under each loader id returns the latest
versions and passes ``verify_store``; after a final ``gc`` no temporary or
build directory is left in the cache (no hidden entry, no ``.partial``,
``.tmp`` or ``.discard`` file); no process of the test is alive. An
exception of gc, or a warning of gc that it kept other users' files or
could not delete some, is a violation too: one user owns every file here.

A stale vector is reported with its likely cause, from the writer's journal
of every version's size and mtime: ``same_tick`` (the source was rewritten
keeping the returned version's size and mtime) or ``unseen_rewrite`` (it
was not: the entry recorded an identity that is not its vector's source's).
``--no-gc`` is a control run: no gc loop, gc only at the end. ``--sabotage
stale`` breaks the cache on purpose in every process of the run
(:mod:`tests.support._soak_sabotage`, test-only): the run must then report
violations, which shows its checks can fail.

The report is stamped (``stamp``: the commit and whether the tree was dirty,
the command, the machine, the date; :mod:`benchmarks.common._stamp`), as a
benchmark's results are; ``--json FILE`` writes it, e.g. the long run's
``benchmarks/results/soak/soak-600s.json``.

The orchestrator is single-threaded (so it can fork a caller) and a child
subreaper: orphaned pool workers of killed callers become its children, so
it sees, reaps and, if need be, kills every process of the test.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common._portable import portable
from benchmarks.common._report import environment
from benchmarks.common._stamp import run_stamp

from ._soak_killer import Killer
from ._soak_roles import registry_paths, run_role
from ._soak_sabotage import SABOTAGES
from ._soak_sources import sid_of, source_name, write_source

__all__ = ["SoakConfig", "main", "run_soak"]

REPO = Path(__file__).resolve().parents[2]
_PR_SET_CHILD_SUBREAPER = 36
_TICK_S = 0.05
_EXAMPLES = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig:
    """What one soak run does (defaults: the suite's run, but for ``seconds``)."""

    seconds: float
    """How long the callers, gc, writer and killer run."""
    workdir: Path
    """Where the sources, the cache, the records and the logs go."""
    callers: int = 4
    """Processes calling ``cached()``; they start by subprocess, spawn, fork, subprocess, ..."""
    seed: int = 0
    """Seed of the random choices (timings stay the machine's)."""
    sources: int = 200
    """Sources written before the start (the writer adds more)."""
    max_subset: int = 250
    """Largest random subset of one call."""
    delay: float = 0.001
    """Seconds the loader sleeps per item (builds last long enough to be killed)."""
    gc_max_bytes: int = 20_000
    """``max_bytes`` of every other gc run (less than a namespace of a hundred sources)."""
    gc_pause: float = 0.05
    """Most seconds gc sleeps between runs."""
    write_interval: float = 0.02
    """Mean seconds between two rewrites."""
    new_every: float = 0.25
    """Seconds between two new sources."""
    same_tick_ns: int = 2_000_000
    """The timestamp tick simulated: a burst's second rewrite comes within half of it and
    keeps the first one's mtime (0: no such rewrites)."""
    kill_every: tuple[float, float] = (0.5, 2.5)
    """Seconds between two kills: uniform in this range."""
    stop_wait: float = 180.0
    """Seconds a process may take to finish its last call once told to stop (a hang guard)."""
    loader_ids: tuple[str, ...] = ("soak.vectors/1", "soak.vectors/2")
    """One namespace each."""
    gc: bool = True
    """Run gc in a loop (False: a control run, gc only at the end)."""
    sabotage: str | None = None
    """A sabotage of :mod:`tests.support._soak_sabotage` applied in every process, or None."""


def _subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); whether it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class _Proc:
    """One process of the soak (a role), started again when it dies."""

    def __init__(self, name: str, role: str, how: str, cfg: dict[str, Any]) -> None:
        self.name, self.role, self.how, self.cfg = name, role, how, cfg
        self.handle: subprocess.Popen[bytes] | Any = None
        self.pid = 0
        self.killed = False
        self.starts = 0

    def start(self) -> None:
        cfg = {**self.cfg, "role": self.role}
        if self.how == "subprocess":
            self.handle = subprocess.Popen(
                [sys.executable, "-m", "tests.support._soak_roles", self.role, json.dumps(cfg)],
                cwd=REPO, stdin=subprocess.DEVNULL,
            )
        else:
            ctx: Any = multiprocessing.get_context(self.how)
            self.handle = ctx.Process(target=run_role, args=(cfg,), name=self.name)
            self.handle.start()
        self.pid = int(self.handle.pid)
        self.killed = False
        self.starts += 1

    def running(self) -> bool:
        """Whether it was started and has not ended."""
        return self.handle is not None and self.poll() is None

    def poll(self) -> int | None:
        """The exit code once the process ended (reaped), else None."""
        if self.handle is None:
            return None
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        code = self.handle.exitcode
        if code is not None:
            self.handle.join()
        return code  # type: ignore[no-any-return]

    def kill(self) -> None:
        """SIGKILL it (it is our child: its pid is ours until we reap it)."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(_TICK_S)
        return code


def _log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        with contextlib.suppress(ValueError):  # a record torn by SIGKILL
            yield json.loads(line)


@dataclass(slots=True)
class _Run:
    """The state of one soak run."""

    cfg: SoakConfig
    rng: random.Random
    procs: list[_Proc] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Any]] = field(default_factory=dict)
    killer: Killer | None = None

    def violation(self, kind: str, example: Any, count: int = 1) -> None:
        self.violations[kind] += count
        shown = self.examples.setdefault(kind, [])
        if len(shown) < _EXAMPLES:
            shown.append(example)

    @property
    def callers(self) -> list[_Proc]:
        return [p for p in self.procs if p.role == "caller"]

    def reap_orphans(self) -> None:
        mine = {p.pid for p in self.procs}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid in mine:
                    continue
                with contextlib.suppress(psutil.Error, ChildProcessError):
                    if child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)

    def tend(self, restart: bool) -> None:
        """Notice dead processes: count them, restart them (and report those that died alone)."""
        for proc in self.procs:
            code = proc.poll()
            if code is None or proc.handle is None:
                continue
            if code != 0 and not proc.killed:
                self.violation("crashed", {"process": proc.name, "pid": proc.pid, "exit": code,
                                           "log": _log_tail(Path(proc.cfg["log"]))})
            proc.handle = None
            if restart:
                proc.start()
        self.reap_orphans()

    def kill(self, kind: str, target: psutil.Process | _Proc, **info: Any) -> bool:
        """SIGKILL ``target`` and record it; False if it was gone already."""
        event = {"t": time.monotonic(), "kind": kind, "pid": target.pid, **info}
        if isinstance(target, _Proc):
            target.kill()
        else:
            try:
                target.kill()
            except psutil.Error:
                return False
        self.kills.append(event)
        return True


def _prepare(cfg: SoakConfig) -> dict[str, Any]:
    """Write the first sources and the registry; return the paths every role shares."""
    work = cfg.workdir
    if work.exists() and any(work.iterdir()):
        raise ValueError(f"the soak's workdir {str(work)!r} is not empty; give a new directory")
    for sub in ("src", "cache", "records", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    lines, journal = [], []
    for sid in range(cfg.sources):
        st = write_source(work / "src", sid, 0, rng.randint(8, 40))
        lines.append(str(work / "src" / source_name(sid)))
        journal.append(f"{sid} 0 {st.st_size} {st.st_mtime_ns} 0\n")
    (work / "registry").write_text("".join(line + "\n" for line in lines))
    (work / "journal").write_text("".join(journal))
    return {
        "cache": str(work / "cache"), "src": str(work / "src"), "registry": str(work / "registry"),
        "stop": str(work / "stop"), "journal": str(work / "journal"), "parent": os.getpid(),
        "seed": cfg.seed,
        "loader_ids": list(cfg.loader_ids), "sabotage": cfg.sabotage,
    }


def _start(run: _Run, shared: dict[str, Any], hard_deadline: float) -> None:
    cfg, work = run.cfg, run.cfg.workdir
    base = {**shared, "hard_deadline": hard_deadline}
    hows = ["subprocess", "spawn", "fork", "subprocess"]
    for i in range(cfg.callers):
        run.procs.append(_Proc(f"caller{i}", "caller", hows[i % len(hows)], {
            **base, "i": i, "workers": 2 if i % 2 == 0 else 1, "delay": cfg.delay,
            "max_subset": cfg.max_subset, "records": str(work / "records" / f"caller{i}.jsonl"),
            "log": str(work / "logs" / f"caller{i}.log"),
        }))
    if cfg.gc:
        run.procs.append(_Proc("gc", "gc", "subprocess", {
            **base, "max_bytes": cfg.gc_max_bytes, "pause": cfg.gc_pause, "p_calm": 0.01,
            "records": str(work / "records" / "gc.jsonl"), "log": str(work / "logs" / "gc.log"),
        }))
    run.procs.append(_Proc("writer", "writer", "subprocess", {
        **base, "interval": cfg.write_interval, "new_every": cfg.new_every,
        "same_tick_ns": cfg.same_tick_ns, "p_same_size": 0.7, "p_burst": 0.15, "p_newest": 0.3,
        "stats": str(work / "writer.json"), "log": str(work / "logs" / "writer.log"),
    }))
    for proc in run.procs:
        proc.start()


def _stop(run: _Run) -> None:
    """Tell every process to stop; wait for its last call; dump and kill those that hang."""
    Path(run.cfg.workdir / "stop").touch()
    deadline = time.monotonic() + run.cfg.stop_wait
    while time.monotonic() < deadline and any(p.handle is not None and p.poll() is None
                                              for p in run.procs):
        run.tend(restart=False)
        time.sleep(_TICK_S)
    for proc in run.procs:
        if proc.handle is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGUSR1)  # its stacks, into its log
            time.sleep(2.0)
            proc.kill()
            proc.wait(30)
            run.violation("hung", {"process": proc.name, "pid": proc.pid,
                                   "log": _log_tail(Path(proc.cfg["log"]), 8000)})
    run.tend(restart=False)


def _own_tracker() -> int | None:
    """The pid of this process's multiprocessing resource tracker (started with the first
    spawned process; it lives as long as this process and exits with it)."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return int(pid) if pid is not None else None


def _descendants() -> list[psutil.Process]:
    """Every live process below this one (orphans included: this process is a subreaper),
    but for its own resource tracker."""
    tracker = _own_tracker()
    with contextlib.suppress(psutil.Error):
        return [p for p in psutil.Process().children(recursive=True)
                if p.pid != tracker and _status(p) != psutil.STATUS_ZOMBIE]
    return []


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.Error:
        return str(psutil.STATUS_ZOMBIE)


def _wait_for_no_descendants(run: _Run, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := _descendants()) and time.monotonic() < deadline:
        run.reap_orphans()
        time.sleep(_TICK_S)
    run.reap_orphans()
    return left


def _kill_descendants(run: _Run) -> None:
    for proc in run.procs:
        if proc.handle is not None and proc.poll() is None:
            proc.kill()
    for p in _descendants():
        with contextlib.suppress(psutil.Error):
            p.kill()
    for proc in run.procs:
        if proc.handle is not None:
            proc.wait(10)
    _wait_for_no_descendants(run, 10)


def _final(run: _Run, shared: dict[str, Any]) -> dict[str, Any]:
    work = run.cfg.workdir
    proc = _Proc("final", "final", "subprocess", {
        **shared, "hard_deadline": time.monotonic() + run.cfg.stop_wait + 60,
        "out": str(work / "final.json"), "log": str(work / "logs" / "final.log"),
    })
    run.procs.append(proc)
    proc.start()
    code = proc.wait(run.cfg.stop_wait)
    if code is None:
        proc.kill()
        proc.wait(30)
        run.violation("final_error", {"error": "the final check did not finish",
                                      "log": _log_tail(Path(proc.cfg["log"]))})
        return {}
    try:
        out: dict[str, Any] = json.loads((work / "final.json").read_text())
    except (OSError, ValueError):
        run.violation("final_error", {"exit": code, "log": _log_tail(Path(proc.cfg["log"]))})
        return {}
    if out.get("error"):
        run.violation("final_error", out["error"])
    if out.get("n_missing"):
        run.violation("final_missing", out["missing"], out["n_missing"])
    if out.get("n_wrong"):
        journal = _journal(run.cfg.workdir / "journal")
        for entry in out["wrong"]:
            entry["cause"] = _stale_cause({"path": entry["path"],
                                           "returned_version": int(entry["vector"][1]),
                                           "on_disk_at_start": entry["on_disk"]}, journal)
        run.violation("final_wrong", out["wrong"], out["n_wrong"])
    for bad in out.get("verify", []):
        run.violation("verify", bad)
    return out


def _leftovers(cache: Path) -> list[str]:
    """Temporary entries left in the cache: hidden names (temporary siblings, build and gc
    directories, temporary manifests) and ``.partial``/``.tmp``/``.discard`` files."""
    out = []
    for dirpath, dirs, names in os.walk(cache):
        for name in [*dirs, *names]:
            if name.startswith(".") or name.endswith((".partial", ".tmp", ".discard")):
                out.append(os.path.relpath(os.path.join(dirpath, name), cache))
    return sorted(out)


def _excused(rec: dict[str, Any], kills: list[dict[str, Any]]) -> bool:
    """A BuildError of a call during which the caller's own pool worker was killed."""
    if "BuildError" not in rec["error"]["mro"]:
        return False
    return any(k["kind"] == "worker" and k["owner"] == rec["pid"]
               and rec["t0"] <= k["t"] <= rec["t1"] for k in kills)


def _journal(path: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """``(sid, version) -> (size, mtime_ns)`` of every write of a source."""
    out = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            bits = line.split()
            if len(bits) == 5:
                out[int(bits[0]), int(bits[1])] = (int(bits[2]), int(bits[3]))
    return out


def _stale_cause(entry: dict[str, Any], journal: dict[tuple[int, int], tuple[int, int]]) -> str:
    """Why a returned version was older than the one on disk when the call started."""
    sid = sid_of(entry["path"])
    got = journal.get((sid, entry["returned_version"]))
    later = [journal.get((sid, v)) for v in
             range(entry["returned_version"] + 1, entry["on_disk_at_start"] + 1)]
    if got is not None and got in later:
        return ("same_tick: rewritten with the same size and mtime as the returned version "
                "(a racily clean entry)")
    return ("unseen_rewrite: the returned version's own size and mtime differ from the source's "
            "(the entry's recorded identity is not its vector's: a stat taken after the read?)")


def _tally_calls(run: _Run, report: dict[str, Any]) -> None:
    errors = Counter[str]()
    logs = Counter[str]()
    causes = Counter[str]()
    journal = _journal(run.cfg.workdir / "journal")
    calls = checked = excused = 0
    per_caller = Counter[str]()
    for proc in run.callers:
        for rec in _read_jsonl(Path(proc.cfg["records"])):
            calls += 1
            per_caller[proc.name] += 1
            checked += int(rec["checked"])
            logs.update(rec.get("log") or {})
            if rec["n_missing"]:
                run.violation("missing_calls", {
                    "caller": proc.name, "loader_id": rec["lid"], "requested": rec["n"],
                    "missing": rec["n_missing"], "examples": rec["missing"]})
                report["missing_paths"] += int(rec["n_missing"])
            if rec["n_wrong"]:
                run.violation("wrong", rec["wrong"], int(rec["n_wrong"]))
            if rec["n_stale"]:
                for entry in rec["stale"]:
                    entry["cause"] = _stale_cause(entry, journal)
                    causes[entry["cause"]] += 1
                run.violation("stale", rec["stale"], int(rec["n_stale"]))
            err = rec["error"]
            if err is None:
                continue
            errors[err["type"]] += 1
            if _excused(rec, run.kills):
                excused += 1
                continue
            gc_like = {"StoreNotFoundError", "FileNotFoundError", "CorruptStoreError"}
            kind = "errors_gc_like" if gc_like & set(err["mro"]) else "errors_other"
            run.violation(kind, {"caller": proc.name, "pid": rec["pid"], "loader_id": rec["lid"],
                                 "requested": rec["n"], **err})
    report.update(calls=calls, calls_per_caller=dict(per_caller), vectors_checked=checked,
                  stale_causes=dict(causes),
                  errors_by_type=dict(errors), excused_errors=excused,
                  library_log=dict(logs.most_common(10)))


def _tally_gc(run: _Run, report: dict[str, Any]) -> None:
    runs = 0
    removed = Counter[str]()
    for rec in _read_jsonl(run.cfg.workdir / "records" / "gc.jsonl"):
        runs += 1
        removed.update(rec.get("removed") or {})
        if rec.get("error"):
            run.violation("gc_errors", rec["error"])
        for msg in rec.get("warnings") or []:
            # one user owns every file here: a warning about other users' files or about
            # files "the system does not let this user delete" is false
            if "other users" in msg or "does not let this user" in msg:
                run.violation("gc_false_warnings", msg)
            else:
                report["gc_warnings"].append(msg)
    report.update(gc_runs=runs, gc_removed=dict(removed))


def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    """Run one soak; return its report (``report["violation_total"] == 0`` when all held)."""
    started = time.monotonic()
    run = _Run(cfg, random.Random(cfg.seed))
    report: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "missing_paths": 0, "gc_warnings": [],
    }
    report["subreaper"] = _subreaper()
    phases: dict[str, float] = {}
    shared = _prepare(cfg)
    try:
        _start(run, shared, started + cfg.seconds + cfg.stop_wait + 120)
        deadline = time.monotonic() + cfg.seconds
        run.killer = Killer(run.rng, cfg.kill_every, cfg.workdir / "cache", cfg.gc,
                            time.monotonic())
        while (now := time.monotonic()) < deadline:
            run.tend(restart=True)
            run.killer.step(now, run.procs, run.kill)
            time.sleep(_TICK_S)
        phases["run"] = time.monotonic() - started
        _stop(run)
        left = _wait_for_no_descendants(run, 30)
        for p in left:  # pool workers or trackers outliving their caller
            with contextlib.suppress(psutil.Error):
                run.violation("alive", {"pid": p.pid, "cmdline": p.cmdline(), "when": "after stop"})
        phases["stop"] = time.monotonic() - started - sum(phases.values())
        _final(run, shared)
        phases["final"] = time.monotonic() - started - sum(phases.values())
        left = _wait_for_no_descendants(run, 30)
        for p in left:
            with contextlib.suppress(psutil.Error):
                run.violation("alive", {"pid": p.pid, "cmdline": p.cmdline(), "when": "at the end"})
    finally:
        _kill_descendants(run)
    for name in _leftovers(cfg.workdir / "cache"):
        run.violation("leftovers", name)
    _tally_calls(run, report)
    _tally_gc(run, report)
    try:
        report["writer"] = json.loads((cfg.workdir / "writer.json").read_text())
    except (OSError, ValueError):
        report["writer"] = {}
    report["sources"] = len(registry_paths(str(cfg.workdir / "registry")))
    kinds = Counter(k["kind"] for k in run.kills)
    kinds["builder_mid_build"] = sum(1 for k in run.kills if k.get("mid_build"))
    report["kills"] = {**kinds, "total": len(run.kills)}
    report["kill_schedule"] = run.killer.kinds if run.killer else []
    report["restarts"] = {p.name: p.starts - 1 for p in run.procs if p.role != "final"}
    report["violations"] = dict(sorted(run.violations.items()))
    report["violation_total"] = sum(run.violations.values())
    report["wrong"] = run.violations["wrong"] + run.violations["stale"]
    report["missing"] = run.violations["missing_calls"]
    report["examples"] = run.examples
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    report["phases_s"] = {k: round(v, 1) for k, v in phases.items()}
    return report


def _summary(report: dict[str, Any]) -> str:
    kills = report["kills"]
    return (
        f"soak: {report['calls']} calls, {report['vectors_checked']} vectors checked, "
        f"{kills['total']} kills (callers mid-build {kills.get('builder_mid_build', 0)}, "
        f"pool workers {kills.get('worker', 0)}, gc {kills.get('gc', 0)}, callers at any "
        f"moment {kills.get('caller', 0)}), {report['gc_runs']} gc runs, "
        f"{report['writer'].get('rewrites', 0)} rewrites, {report['sources']} sources; "
        f"wrong {report['wrong']}, missing {report['missing']} calls "
        f"({report['missing_paths']} paths); violations {report['violation_total']} "
        f"{report['violations']}; {report['elapsed_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.soak --seconds N [--callers 4] [--workdir D] [--json FILE]``."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="kept afterwards (default: a temporary directory, removed if all held)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--same-tick-ms", type=float, default=2.0,
                        help="timestamp tick simulated by same-size bursts (0: none)")
    parser.add_argument("--no-gc", action="store_true",
                        help="a control run: no gc loop (and no gc kills), gc only at the end")
    parser.add_argument("--sabotage", choices=sorted(SABOTAGES), default=None,
                        help="break the cache on purpose (the run must report violations)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tsc-soak-"))
    env = environment()
    stamp = run_stamp("tests.support.soak", argv, env)
    report = run_soak(SoakConfig(seconds=args.seconds, callers=args.callers, workdir=workdir,
                                 seed=args.seed, same_tick_ns=int(args.same_tick_ms * 1e6),
                                 gc=not args.no_gc, sabotage=args.sabotage))
    report = {"stamp": stamp, "env": env, **report}
    text = json.dumps(report, indent=1, default=str)
    if args.json is not None:  # its paths as anyone can read them (<workdir>/..., relative)
        args.json.write_text(json.dumps(portable(json.loads(text), workdir=workdir), indent=1)
                             + "\n")
    print(text)
    print(_summary(report), file=sys.stderr)
    if report["violation_total"] == 0 and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    elif report["violation_total"]:
        print(f"soak: records and logs kept in {workdir}", file=sys.stderr)
    return 1 if report["violation_total"] else 0


if __name__ == "__main__":
    sys.exit(main())
