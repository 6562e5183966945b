"""A method whose agents die is a result of the benchmark, not its crash.

End to end, ``python -m benchmarks.run --quick`` runs next to ``no_cache`` three methods of
``tests/support/_failing_methods.py`` that fail for real in their agent processes (one SIGKILLs
itself in the rounds of several agents, one raises, one sleeps past ``--agent-timeout``):
the run completes, exits 0, and records each failure in the round it happened, with its
evidence. An interrupted run keeps what it measured and ``--resume`` goes on from there.
The memory guard's decision, the classification of deaths (real processes killed for
real; the kernel's OOM report parsed from its real format), the atomic writes and the
target marks are tested directly.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.common import _failures, _report, _results
from benchmarks.common._memory import available_memory, estimate_round, guard, sample
from benchmarks.common._stamp import stamp
from benchmarks.common.methods import METHODS, get
from benchmarks.run import _rounds
from benchmarks.run._driver import AgentError

from ..support._failing_methods import SLEEPING, SleepsInRoundOfOne
from .test_bench_reports import absolute_paths

for _module in ("torch", "pandas", "datasets", "zarr", "matplotlib"):
    pytest.importorskip(_module)  # the benchmark's extra dependencies

REPO = Path(__file__).resolve().parents[2]
KILLED = "tests.support._failing_methods:KILLED"
RAISES = "tests.support._failing_methods:RAISES"
SLEEPS = "tests.support._failing_methods:SLEEPS"
TIMEOUT_S = float(SleepsInRoundOfOne.agent_timeout_s or 0)  # the sleeping method's own limit
RUN_TIMEOUT_S = 600.0  # every other method's: a guard against hangs, not a timing assertion
HANG_GUARD_S = 240.0  # a guard against hangs on a loaded machine, not a timing assertion
GB = 1e9
# ``python -m benchmarks.run`` as a terminal runs it, where Ctrl-C raises KeyboardInterrupt, even
# if whoever started the tests ignores SIGINT (nohup, a script's background job: CI): a program
# inherits an ignored SIGINT and Python keeps it ignored, so the interrupt would never arrive
AS_IN_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "runpy.run_module('benchmarks.run', run_name='__main__', alter_sys=True)")


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    root = tmp_path_factory.mktemp("failing")
    proc = _bench("--workdir", str(root / "work"), "--results", str(root / "results"),
                  "--out", "failing", "--methods", f"no_cache,{KILLED},{RAISES},{SLEEPS}",
                  "--agents", "1,2", "--agent-timeout", str(RUN_TIMEOUT_S))
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads((root / "results" / "failing.json").read_text())
    table = (root / "results" / "failing.md").read_text()
    assert table.strip() in proc.stdout
    for plot in ("time_to_vectors", "memory_vs_agents", "open_vs_n"):
        assert (root / "results" / f"failing-{plot}.png").read_bytes().startswith(b"\x89PNG")
    assert not (root / "results" / "latest.json").exists()  # --out never touches latest.*
    # the failures' tracebacks and logs name no directory of this machine either
    assert absolute_paths((root / "results" / "failing.json").read_text()) == []
    assert absolute_paths(table) == []
    return report, table, proc.stderr


@pytest.mark.timeout(400)
def test_a_method_that_works_is_measured_as_before(
        failing_run: tuple[dict[str, Any], str, str]) -> None:
    report, _table, _ = failing_run
    rec = report["methods"]["no_cache"]
    assert {r["status"] for r in rec["rounds"].values()} == {"ok"}
    for key in ("first_agent_s", "later_agent_s", "lookup_items_per_s", "dataloader_epoch_s"):
        assert rec[key] > 0, key
    assert sorted(rec["memory"]) == ["1", "2"] and rec["vectors_equal_no_cache"] is True
    # every agent asked the kernel to kill it first if memory runs out
    assert rec["rounds"]["first"]["oom_score_adj"] == [1000]
    assert rec["rounds"]["2"]["oom_score_adj"] == [1000, 1000, 1000]


@pytest.mark.timeout(400)
def test_an_agent_killed_by_a_signal_is_recorded_in_its_round(
        failing_run: tuple[dict[str, Any], str, str]) -> None:
    report, table, stderr = failing_run
    rec = report["methods"][KILLED]
    rounds = rec["rounds"]
    # the rounds before the deaths measured their figures
    assert rounds["first"]["status"] == rounds["1"]["status"] == "ok"
    assert rec["later_agent_s"] > 0 and rec["lookup_items_per_s"] > 0 and "1" in rec["memory"]
    # the round of 2 agents, each of which SIGKILLs itself, is a result
    dead = rounds["2"]
    assert dead["status"] == "killed" and dead["signal"] == "SIGKILL" and dead["exitcode"] == -9
    assert dead["cause"] == "SIGKILL"  # the kernel did not do it: not called out of memory
    assert dead["role"] == "agent" and dead["agents"] == 3 and dead["waiting_for"] == "ready"
    assert "2" not in rec["memory"]
    last = dead["last_memory"]
    assert 20e6 < last["anon"] < 4 * GB and last["rss"] >= last["anon"]  # an interpreter's
    assert dead["elapsed_s"] > 0
    assert re.fullmatch(r"killed by SIGKILL at \d+\.\d GB( \(2 of 3 agents\))?", dead["text"])
    assert any("not sent by the driver" in line for line in dead["evidence"])
    # its cells in the tables say so, as does the section of failures and the log
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| {KILLED} |"))
    assert "killed by SIGKILL at" not in row  # the main table's K=4 columns: no such round
    memory = table.split("| method | USS K=", 1)[1]  # the memory table, after the others
    mem_row = next(ln for ln in memory.splitlines() if ln.startswith(f"| {KILLED} |"))
    assert mem_row.count("killed by SIGKILL at") == 3  # USS K=2, PSS K=2, anonymous K=2
    assert "## Failures and skipped rounds" in table
    assert f"| {KILLED} | 2 agents | killed | SIGKILL |" in table
    assert f"{KILLED}: 2 agents: killed by SIGKILL" in stderr


@pytest.mark.timeout(400)
def test_an_agent_that_raises_is_recorded_and_the_later_rounds_are_skipped(
        failing_run: tuple[dict[str, Any], str, str]) -> None:
    report, table, _ = failing_run
    rounds = report["methods"][RAISES]["rounds"]
    first = rounds["first"]
    assert first["status"] == "error" and first["signal"] is None
    assert first["cause"] == "RuntimeError: deliberate failure in load() of 200 paths"
    assert "_failing_methods.py" in first["error"] and "Traceback" in first["error"]
    assert first["text"] == f"error: {first['cause']}"
    for k in ("1", "2"):
        assert rounds[k] == {"status": "skipped", "cause": "the first agent failed",
                             "text": "skipped: the first agent failed"}
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| {RAISES} |"))
    assert row.count("error: RuntimeError: deliberate failure") == 2  # first agent s, disk
    assert row.count("skipped: the first agent failed") == 6


@pytest.mark.timeout(400)
def test_an_agent_past_the_time_limit_is_stopped_and_recorded(
        failing_run: tuple[dict[str, Any], str, str]) -> None:
    report, _table, _ = failing_run
    rounds = report["methods"][SLEEPS]["rounds"]
    assert rounds["first"]["status"] == "ok"
    late = rounds["1"]
    assert late["status"] == "timeout" and late["cause"] == f"past the {TIMEOUT_S:g} s agent timeout"
    assert late["elapsed_s"] >= TIMEOUT_S  # stopped once past its limit, never before
    assert late["text"].startswith(f"timeout: past the {TIMEOUT_S:g} s agent timeout at ")
    assert not psutil.pid_exists(late["pid"])  # stopped, and reaped
    assert rounds["2"]["status"] == "skipped" and "the 1-agent round failed" in rounds["2"]["text"]


@pytest.mark.timeout(400)
def test_an_interrupted_run_keeps_its_figures_and_resume_goes_on(tmp_path: Path) -> None:
    work, results = tmp_path / "work", tmp_path / "results"
    common = ["--workdir", str(work), "--results", str(results), "--out", "run", "--open-sizes", "100",
              "--agents", "1", "--agent-timeout", "600"]
    file = results / "run.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_IN_A_TERMINAL, "--quick", *common,
         "--methods", f"no_cache,{SLEEPS}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        # no_cache is written, and SLEEPS's 1-agent round has begun: its agent sleeps
        while not (file.exists() and "no_cache" in json.loads(file.read_text())["methods"]
                   and any(work.rglob(SLEEPING))):
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "no agent of the 1-agent round began to sleep"
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for child in children:
            if child.is_running():
                child.kill()
    assert proc.returncode == 130, err[-4000:]
    assert "interrupted" in err and "--resume" in err
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"agents left running: {alive}"
    first = json.loads(file.read_text())
    assert list(first["methods"]) == ["no_cache"]
    measured = first["methods"]["no_cache"]["measured"]

    again = _bench(*common, "--resume", "--methods", "no_cache,raw_memmap")
    assert again.returncode == 0, again.stderr[-6000:]
    assert "no_cache: already measured" in again.stderr
    report = json.loads(file.read_text())
    assert list(report["methods"]) == ["no_cache", "raw_memmap"]
    assert report["methods"]["no_cache"]["measured"] == measured  # kept, not measured again
    assert {r["status"] for r in report["methods"]["raw_memmap"]["rounds"].values()} == {"ok"}
    assert report["methods"]["raw_memmap"]["vectors_equal_no_cache"] is True
    assert [r["resumed"] for r in report["env"]["runs"]] == [False, True]
    assert report["stamp"] == first["stamp"] == report["methods"]["no_cache"]["stamp"]
    assert "--resume" in report["methods"]["raw_memmap"]["stamp"]["command"]
    assert "--resume" not in report["stamp"]["command"]

    redrawn = _bench(*common, "--resume", "--methods", "no_cache,raw_memmap", timeout=120)
    assert redrawn.returncode == 0 and "tables and plots redrawn" in redrawn.stderr
    assert json.loads(file.read_text()) == report  # nothing measured, nothing recorded

    before = file.read_bytes()
    other = _bench(*common[:-4], "--agents", "1,2", "--agent-timeout", "600", "--resume",
                   "--methods", "no_cache", timeout=120)
    assert other.returncode == 2
    assert "cannot resume" in other.stderr and "agents: [1] there, [1, 2] now" in other.stderr
    assert file.read_bytes() == before


def _config(**kw: Any) -> _rounds.Config:
    base: dict[str, Any] = dict(images=10, seed=0, workdir=Path("."), data=Path("."),
                                results=Path("."), methods=[], agents=[1, 4], open_sizes=[10],
                                budget_s=0.1, quick=True, start_method="spawn", open_repeats=1)
    return _rounds.Config(**{**base, **kw})


def test_the_disk_check_names_the_work_directory(tmp_path: Path) -> None:
    from benchmarks.run.run import disk_check

    workdir = tmp_path / "not" / "made" / "yet"  # its free space is its nearest parent's
    check = disk_check(_config(workdir=workdir, data=tmp_path / "data"))
    assert check["path"] == str(workdir) and check["free_bytes"] > 0


def _ok_round(agent_anon: float, baseline_anon: float) -> dict[str, Any]:
    return {"status": "ok", "peak_memory": [{"anon": int(agent_anon), "rss": int(agent_anon)},
                                            {"anon": int(baseline_anon)}]}


def test_memory_guard_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    assert estimate_round(8_000, 300, 4) == 32_300
    with pytest.raises(ValueError, match="k >= 1"):
        estimate_round(1, 1, 0)
    fits = guard(int(16.3 * GB), int(22 * GB), allow_oom=False)
    assert fits.run and not fits.over and fits.text == "estimated 16.3 GB of 22.0 GB available"
    over = guard(int(32.3 * GB), int(22 * GB), allow_oom=False)
    assert not over.run and over.over
    assert over.text == "skipped: would need about 32.3 GB of 22.0 GB available"
    allowed = guard(int(32.3 * GB), int(22 * GB), allow_oom=True)
    assert allowed.run and allowed.over and "--allow-oom" in allowed.text

    # the decision before a round of K agents, from the 1-agent round's peak memory
    monkeypatch.setattr(_rounds, "available_memory", lambda: (int(22 * GB), "MemAvailable"))
    rounds = {"1": _ok_round(8 * GB, 0.3 * GB)}
    four = _rounds.guard_round(_config(), rounds, 4)
    assert not four["run"]
    assert four["record"]["text"] == "skipped: would need about 32.3 GB of 22.0 GB available"
    assert four["record"]["status"] == "skipped"
    assert four["guard"]["need_bytes"] == int(8 * GB) * 4 + int(0.3 * GB)
    assert _rounds.guard_round(_config(), rounds, 2)["run"]  # 16.3 GB fit
    assert _rounds.guard_round(_config(allow_oom=True), rounds, 4)["run"]
    # a 1-agent round the OOM killer ended: its last memory is a lower bound, still guarded
    oom = {"1": {"status": "killed", "cause": "out of memory", "text": "killed: out of memory",
                 "peak_memory": {"anon": int(9 * GB)}, "others": [
                     {"role": "baseline", "last_memory": {"anon": int(0.2 * GB)}}]}}
    verdict = _rounds.guard_round(_config(), oom, 4)
    assert not verdict["run"] and "36.2 GB of 22.0 GB" in verdict["record"]["text"]
    # a 1-agent round that raised or timed out: K agents would too
    err = {"1": {"status": "error", "cause": "ValueError: x", "text": "error: ValueError: x"}}
    verdict = _rounds.guard_round(_config(allow_oom=True), err, 4)
    assert not verdict["run"]
    assert verdict["record"]["text"] == "skipped: the 1-agent round failed (error: ValueError: x)"
    # and what the machine has is a real figure
    available, source = available_memory()
    assert 0 < available <= psutil.virtual_memory().total and source


def test_deaths_are_classified_from_exit_status_and_kernel_evidence() -> None:
    c = _failures.classify
    assert c(-9, oom_logged=True) == ("killed", "out of memory")
    assert c(-9, oom_count_rose=True) == ("killed", "out of memory")
    assert c(-9, oom_count_rose=False) == ("killed", "SIGKILL")
    assert c(-9, oom_count_rose=None) == ("killed", "SIGKILL")
    assert c(-11, oom_count_rose=True) == ("killed", "SIGSEGV")  # only SIGKILL is the OOM's
    assert c(-15, timeout_s=60) == ("timeout", "past the 60 s agent timeout")
    assert c(1, error="Traceback...\n  ...\nMemoryError\n") == ("error", "MemoryError")
    assert c(3) == ("error", "exited with status 3")
    assert c(0) == ("error", "exited without sending its results")
    assert _failures.failure_text("killed", "out of memory", int(8.25e9)) == (
        "killed: out of memory at 8.2 GB")
    assert _failures.failure_text("killed", "SIGSEGV", None) == "killed by SIGSEGV"


def test_the_oom_killers_report_is_parsed() -> None:
    line = ("3,4821,5512345678,-;Out of memory: Killed process 31337 (python) "
            "total-vm:12001234kB, anon-rss:8056000kB, file-rss:2048kB, shmem-rss:0kB, UID:0 "
            "pgtables:16000kB oom_score_adj:1000")
    kill = _failures.parse_oom_kill(line)
    assert kill is not None
    assert kill["pid"] == 31337 and kill["name"] == "python"
    assert kill["anon_rss"] == 8056000 * 1024 and kill["line"].startswith("Out of memory")
    memcg = ("[ 9.1] Memory cgroup out of memory: Killed process 42 (pt_main thread) "
             "total-vm:1kB, anon-rss:2kB, file-rss:0kB")
    assert _failures.parse_oom_kill(memcg) == {
        "pid": 42, "name": "pt_main thread", "anon_rss": 2048,
        "line": memcg.split("] ", 1)[0] + "] " + memcg.split("] ", 1)[1]}
    assert _failures.parse_oom_kill("6,1,2,-;oom_reaper: reaped process 42 (python)") is None


@pytest.mark.parametrize("kernel_log", ["unreadable", "as on this machine"])
def test_a_real_process_killed_with_sigkill(monkeypatch: pytest.MonkeyPatch,
                                            kernel_log: str) -> None:
    """Without a readable kernel log, SIGKILL plus a rise of the kernel's OOM kill count
    during the round is called out of memory; a readable log that does not name the
    process overrules the count. Nothing else is."""
    if kernel_log == "unreadable":
        monkeypatch.setattr(_failures, "KMSG", "/nonexistent/kmsg")
    counts = iter([7, 8, 8])  # at the round's start, then at the death: one OOM kill
    monkeypatch.setattr(_failures, "oom_kill_count", lambda: next(counts))
    proc = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(50 << 20); "
                             "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it holds its 50 MB
        watch = _failures.Watch()
        watch.add(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        record = watch.failure(proc.pid, proc.returncode, agent=0, role="agent",
                               waiting_for="ready")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        watch.close()
    assert record["status"] == "killed" and record["signal"] == "SIGKILL"
    assert record["last_memory"]["anon"] >= 50 << 20
    if kernel_log == "unreadable":
        assert "/nonexistent/kmsg" in record["kernel_log"]
        assert record["cause"] == "out of memory"
        assert record["text"].startswith("killed: out of memory at 0.")
        assert "oom_kill in /proc/vmstat rose by 1 during the round" in record["evidence"]
    elif record["kernel_log"] == "read":
        assert record["cause"] == "SIGKILL"
        assert "kernel log: no OOM kill of this pid" in record["evidence"]
    else:  # this machine's kernel log is not readable either
        assert record["cause"] == "out of memory"


def test_memory_samples_of_a_live_process() -> None:
    mem = sample(os.getpid(), private=True)
    assert mem is not None
    assert 0 < mem["anon"] <= mem["rss"] <= mem["peak_rss"] and 0 < mem["uss"] <= mem["rss"]
    assert sample(2**22 + 12345) is None  # no such process


def test_results_are_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "r.json"
    _results.write_atomic(target, "old\n")
    assert target.read_text() == "old\n"

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        _results.write_atomic(target, "new\n")
    assert target.read_text() == "old\n"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary left
    monkeypatch.undo()
    _results.write_atomic(target, b"new\n")
    assert target.read_text() == "new\n"


def test_resume_refuses_another_configuration(tmp_path: Path) -> None:
    files = _results.ResultsFile(tmp_path, "x")
    assert files.resume({"images": 10}) is None  # nothing to resume
    config = {"images": 10, "seed": 0, "agents": [1, 4], "allow_oom": True}
    run = {"commit": None, "dirty": None, "command": "python -m benchmarks.run", "machine": "m",
           "date": "2026-12-04T00:00:00+00:00"}
    files.save(stamp({"config": config, "methods": {"no_cache": {}}}, run), "table\n")
    resumed = files.resume(dict(config))
    assert resumed is not None and resumed["methods"] == {"no_cache": {"stamp": run}}
    with pytest.raises(ValueError, match=r"agents: \[1, 4\] there, \[1, 2\] now") as info:
        files.resume(dict(config, agents=[1, 2]))
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, _results.ResumeMismatchError) and str(again) == str(info.value)
    assert _results.ResultsFile(tmp_path).plot_prefix == "" and files.plot_prefix == "x-"
    with pytest.raises(ValueError, match="plain file name"):
        _results.ResultsFile(tmp_path, "../elsewhere")


def test_agent_error_keeps_its_record_across_processes() -> None:
    err = AgentError("agent 0 killed", {"status": "killed", "text": "killed: out of memory"})
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == "agent 0 killed" and again.failure["status"] == "killed"


def _report_with(torch_save_later: dict[str, Any], tsc_four: dict[str, Any]) -> dict[str, Any]:
    ok = {"status": "ok"}
    tsc = {"rounds": {"first": ok, "1": ok, "4": tsc_four}, "first_agent_s": 2.0,
           "later_agent_s": 0.01, "lookup_items_per_s": 5e5, "batch_items_per_s": 6e5,
           "disk_bytes": 1e9}
    torch_save = {"rounds": {"first": ok, "1": torch_save_later, "4": ok}, "first_agent_s": 70.0}
    return {"tensorstore_cache": tsc, "torch_save": torch_save,
            "manager_vectors": {"rounds": {"first": ok, "1": ok}, "later_agent_s": 1.0,
                                "lookup_items_per_s": 7e3}}


def test_targets_that_need_a_failed_figure_say_so() -> None:
    oom = {"status": "killed", "cause": "out of memory", "text": "killed: out of memory at 8.2 GB"}
    skip = {"status": "skipped", "cause": "would need about 33 GB of 22 GB available",
            "text": "skipped: would need about 33 GB of 22 GB available"}
    t = _report.targets(_report_with(oom, skip), {}, [10])
    later = t["later_agent_vs_torch_save"]
    assert later["status"] == "FAILED" and later["value"] is None
    assert later["reason"] == "torch_save, 1 agent: killed: out of memory at 8.2 GB"
    assert t["later_agent_vs_manager_vectors"]["status"] == "PASS"
    assert t["memory_4_agents"]["status"] == "SKIPPED"
    assert "tensorstore_cache, 4 agents: skipped" in t["memory_4_agents"]["reason"]
    assert t["lookup_vs_hf_datasets"]["status"] == "n/a"  # not run at all
    env = {"sizes": {"unique_paths": 10, "ratings_rows": 20, "column_bytes": 1, "agents": [1, 4]},
           "cpu": "x", "cores": 2, "ram_bytes": 2**34, "python": "3", "versions": {},
           "date": "d"}
    table = _report.markdown({"env": env, "methods": _report_with(oom, skip),
                              "open_vs_n": {}, "targets": t})
    assert ("| later agent: torch_save time / tensorstore_cache time | torch_save, 1 agent: "
            "killed: out of memory at 8.2 GB | >= 20x | FAILED |") in table
    row = next(ln for ln in table.splitlines() if ln.startswith("| torch_save |"))
    assert row.count("killed: out of memory at 8.2 GB") == 6  # every 1-agent figure


def test_test_only_methods_stay_out_of_the_benchmark() -> None:
    assert not [m for m in METHODS if ":" in m or "fail" in m or "raise" in m]
    # every test-only method says so in its summary (tests/support/_failing_methods.py,
    # _probe_methods.py): none is registered
    assert not [m for m in METHODS if get(m).summary.startswith("test only")]
    for name in (KILLED, RAISES, SLEEPS, "tests.support._probe_methods:GC_AT_LOAD"):
        assert get(name).summary.startswith("test only"), name
    text = (REPO / "benchmarks" / "README.md").read_text()
    listed = [ln.split("`")[1] for ln in text.splitlines()
              if ln.startswith("| `") and ln.count("|") == 3]
    assert listed == list(METHODS)
