"""The sweep benchmark runs end to end at a tiny size, and its measuring parts are sound.

The end-to-end test runs ``python -m benchmarks.sweep --quick`` (300 covers, 2 agents,
2 trials per method, one run) in a subprocess, with one trial made to kill itself with
SIGKILL: the sweep must record that trial as a result and finish every other method.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.common._failures import parse_oom_kill
from benchmarks.sweep._decode_meter import DecodeMeter, read_log
from benchmarks.sweep._node_memory import NodeMemory, resident_bytes
from benchmarks.sweep._sweep_agents import trial_outcome
from tests.support._sweep_procs import map_and_hold

for _module in ("torch", "pandas", "datasets", "optuna", "psutil", "matplotlib"):
    pytest.importorskip(_module)  # the benchmark's extra dependencies

import optuna  # noqa: E402

from benchmarks.sweep.sweep import CONFIGS, METHODS  # noqa: E402

from .test_bench_reports import absolute_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
Sweep = tuple[Path, dict[str, Any], str]  # work dir, sweep.json, printed table


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    root = tmp_path_factory.mktemp("sweep")
    work, results = root / "work", root / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweep", "--quick", "--workdir", str(work),
         "--results", str(results), "--inject-fault", "no_cache:1:kill"],
        cwd=REPO, capture_output=True, text=True, timeout=420,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads((results / "sweep.json").read_text())
    return work, report, proc.stdout


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (longest mount point of /proc/mounts)."""
    best, kind = "", ""
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            _dev, mount, fstype = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


def _trials(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {name: res["trials"] for name, res in report["runs"][0]["methods"].items()}


@pytest.mark.timeout(480)
def test_every_trial_is_a_fresh_process_of_a_real_optuna_study(sweep: Sweep) -> None:
    work, report, _ = sweep
    trials = _trials(report)
    assert list(trials) == list(METHODS)
    pids = [t["pid"] for ts in trials.values() for t in ts]
    pids += [t["pid"] for t in report["runs"][0]["baseline"]["trials"]]
    assert len(pids) == len(set(pids)) == 2 * len(METHODS) + 2
    assert os.getpid() not in pids
    # the study lives in SQLite; each method's was given the same configurations in order
    storage = f"sqlite:///{work / 'sweep.db'}"
    for name, ts in trials.items():
        study = optuna.load_study(study_name=f"{name}-run1", storage=storage)
        got = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        assert [t.params for t in got] == CONFIGS[:2], name
        for t, rec in zip(got, ts, strict=True):
            assert rec["params"] == t.params
            if rec["status"] == "ok":
                assert t.state == optuna.trial.TrialState.COMPLETE and t.value == rec["val_rmse"]
            else:
                assert t.state == optuna.trial.TrialState.FAIL
    with sqlite3.connect(work / "sweep.db") as db:  # a real file any agent can open
        assert db.execute("select count(*) from studies").fetchone()[0] == len(METHODS)


@pytest.mark.timeout(480)
def test_a_killed_trial_is_a_result_and_the_sweep_goes_on(sweep: Sweep) -> None:
    _work, report, stdout = sweep
    killed = _trials(report)["no_cache"][1]
    assert killed["status"] == "killed" and killed["outcome"].startswith("killed by SIGKILL at ")
    assert killed["failure"]["signal"] == "SIGKILL" and killed["failure"]["exitcode"] == -9
    assert "trial 1: killed by SIGKILL" in stdout
    for name, ts in _trials(report).items():
        expected = ["ok", "killed"] if name == "no_cache" else ["ok", "ok"]
        got = ["ok" if name == "torch_save" and _torn_read(t) else t["status"] for t in ts]
        assert got == expected, (name, [t.get("log_tail") for t in ts])


def _torn_read(trial: dict[str, Any]) -> bool:
    """The original torch.save method's own race, which the sweep reproduces: an agent that
    finds the .pt file another agent is still writing loads a torn file."""
    tail = str(trial.get("log_tail"))
    return trial["status"] == "error" and ("Ran out of input" in tail
                                           or "PytorchStreamReader failed" in tail)


@pytest.mark.timeout(480)
def test_same_configuration_same_rmse_whatever_the_method(sweep: Sweep) -> None:
    _work, report, _ = sweep
    check = report["rmse_check"]
    assert check["same"] and check["max_rmse_difference"] <= check["tolerance"]
    first = {name: ts[0]["val_rmse"] for name, ts in _trials(report).items()
             if ts[0]["status"] == "ok"}  # (torch_save's may be a torn read, see above)
    assert "no_cache" in first and "tensorstore_cache" in first
    assert len(set(first.values())) == 1, first
    # the two configurations train differently: the check compares something
    second = {t["val_rmse"] for ts in _trials(report).values() for t in ts[1:]
              if t["status"] == "ok"}
    assert len(second) == 1 and second != {first["no_cache"]}


@pytest.mark.timeout(480)
def test_timings_decode_memory_and_disk_are_measured(sweep: Sweep) -> None:
    work, report, _ = sweep
    sizes = report["env"]["sizes"]
    covers = sizes["train_covers"] + sizes["test_covers"]
    assert covers == 300 and sizes["train_covers"] == round(300 * 129_777 / 181_777)
    for name, ts in _trials(report).items():
        for t in ts:
            if t["status"] != "ok":
                continue
            marks = [t[f"at_{k}"] for k in ("spawn", "main", "imported", "table", "vectors",
                                            "first_batch", "trained", "end", "exit")]
            assert marks == sorted(marks), (name, marks)
            assert t["interpreter_s"] > 0 and t["import_s"] > 0 and t["data_s"] > 0
            assert t["ttfb_s"] == pytest.approx(t["startup_s"] + t["data_s"])
            assert t["data_s"] == pytest.approx(t["table_read_s"] + t["vectors_s"]
                                                + t["dataset_s"])
            assert 0 < t["data_share"] < 1 and t["steps_done"] == 4
            assert t["write_bytes"] >= 0
    summary = report["summary"][0]["methods"]
    # tensorstore_cache: two trials at once on an empty cache, yet every cover decoded once
    tsc = _trials(report)["tensorstore_cache"]
    assert sum(t["decode_calls"] for t in tsc) == covers
    assert summary["tensorstore_cache"]["disk_bytes"] >= covers * 3 * 32 * 32 * 4
    # decoding is counted where it happens: in the pool of processes datasets.map starts
    hf = _trials(report)["hf_datasets"]
    assert any(set(t["decode_pids"]) - {t["pid"]} for t in hf)
    assert all(t["decode_cpu_s"] > 0 for t in _trials(report)["no_cache"][:1])
    if _filesystem(work) != "tmpfs":  # tmpfs writes nothing to a disk, and counts nothing
        for name in ("torch_save", "hf_datasets", "tensorstore_cache"):
            assert summary[name]["write_bytes"] > covers * 3 * 32 * 32 * 4 * 0.9, name
    for name in METHODS:
        peak = summary[name]["peak"]
        assert summary[name]["peak_node_bytes"] > 100 * 2**20, name  # at least the interpreters
        assert peak["node"] == peak["pss"] - peak["cache_pss"] + peak["cache_resident"]
    assert report["baseline"]["peak_node_bytes"] > 100 * 2**20
    assert summary["manager_vectors"]["peak"]["processes"] >= 2  # trials and the manager


@pytest.mark.timeout(480)
def test_report_table_targets_and_plot(sweep: Sweep) -> None:
    work, report, stdout = sweep
    results = work.parent / "results"
    # written as anyone can rerun it: no directory of this machine (commands, logs)
    assert (report["config"]["workdir"], report["config"]["results"]) == ("<workdir>", "<results>")
    assert absolute_paths((results / "sweep.json").read_text()) == []
    table = (results / "sweep.md").read_text()
    assert table.strip() in stdout
    assert report["stamp"]["command"] == report["env"]["command"]  # the code it measured
    assert f"Measured at commit {report['stamp']['commit'][:12]}" in table
    for name in METHODS:
        assert f"| {name} |" in table
    assert set(report["targets"]) == {"later_data_vs_torch_save", "later_data_vs_no_cache",
                                      "first_round_decode_vs_torch_save", "wall_lowest",
                                      "peak_memory_vs_store",
                                      "later_data_tensorstore_cache_vs_hf_datasets",
                                      "later_data_tensorstore_cache_none_vs_hf_datasets"}
    for t in report["targets"].values():
        assert t["status"] in {"PASS", "PASS (1 run)", "MISS", "MISS (within spread)", "n/a"}
    png = (results / "sweep_timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


# ---- the measuring parts, on their own -------------------------------------------------


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_trial_outcome_of_real_exits(how: str) -> None:
    code = ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)" if how == "kill"
            else "raise SystemExit(3)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        proc.wait(60)
    finally:
        proc.kill()
    out = trial_outcome(proc.returncode, pids={proc.pid}, kills={}, kernel_readable=True,
                        oom_count_rose=0, last_memory=10**8, error=None, timeout_s=None)
    if how == "kill":
        assert (out["status"], out["text"], out["signal"]) == (
            "killed", "killed by SIGKILL at 0.1 GB", "SIGKILL")
    else:
        assert (out["status"], out["exitcode"]) == ("error", 3)
        assert out["text"] == "error: exited with status 3"
    ok = trial_outcome(0, pids={1}, kills={}, kernel_readable=True, oom_count_rose=0,
                       last_memory=None, error=None, timeout_s=None)
    assert ok["status"] == "ok"


def test_trial_outcome_out_of_memory_in_the_trial_or_its_children() -> None:
    kill = parse_oom_kill("Out of memory: Killed process 4242 (python) total-vm:9800000kB, "
                          "anon-rss:8054688kB, file-rss:0kB, shmem-rss:0kB, UID:0 "
                          "oom_score_adj:1000")
    assert kill is not None
    kills = {4242: kill}
    out = trial_outcome(-9, pids={4242}, kills=kills, kernel_readable=True, oom_count_rose=1,
                        last_memory=10**9, error=None, timeout_s=None)
    assert out["text"] == "killed: out of memory at 8.2 GB" and out["oom_victim"] == 4242
    # a build worker of the trial was killed for memory; the trial then raised
    out = trial_outcome(1, pids={10, 4242}, kills=kills, kernel_readable=True, oom_count_rose=1,
                        last_memory=10**9, error="Traceback ...\nBrokenProcessPool: gone",
                        timeout_s=None)
    assert out["status"] == "killed" and out["text"] == "killed: out of memory at 8.2 GB"
    # no readable kernel log: SIGKILL while the kernel's OOM count rose, at the last sample
    out = trial_outcome(-9, pids={7}, kills={}, kernel_readable=False, oom_count_rose=1,
                        last_memory=3 * 10**9, error=None, timeout_s=None)
    assert out["text"] == "killed: out of memory at 3.0 GB"
    out = trial_outcome(-9, pids={7}, kills={}, kernel_readable=True, oom_count_rose=0,
                        last_memory=None, error=None, timeout_s=60.0)
    assert out["status"] == "timeout"


def test_resident_bytes_follows_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = np.random.default_rng(0).random(2 * 2**20 // 8)
    data.tofile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident_bytes(path) <= 64 * 1024  # dropped (a few pages may come back)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
    assert resident_bytes(path) == path.stat().st_size
    assert resident_bytes(tmp_path / "missing") == 0


def test_node_memory_counts_a_shared_file_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "store.bin"
    np.ones(16 * 2**20, dtype=np.uint8).tofile(path)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readers = []
    try:
        for _ in range(2):
            ready = ctx.Event()
            proc = ctx.Process(target=map_and_hold, args=(str(path), ready, stop))
            proc.start()
            assert ready.wait(60)
            readers.append(proc)
        pids = [p.pid for p in readers if p.pid is not None]
        assert len(pids) == 2
        sample = NodeMemory([cache]).sample(pids)
        mib = 2**20
        # both map all 16 MiB: PSS charges each half, the page cache holds it once
        assert sample["cache_pss"] == pytest.approx(16 * mib, abs=mib)
        assert sample["cache_resident"] == 16 * mib
        assert sample["node"] == sample["pss"] - sample["cache_pss"] + 16 * mib
        alone = NodeMemory().sample(pids)
        assert alone["cache_resident"] == 0 and alone["pss"] == pytest.approx(sample["pss"],
                                                                               rel=0.05)
    finally:
        stop.set()
        for proc in readers:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def test_decode_meter_counts_every_call_in_every_process(tmp_path: Path) -> None:
    from PIL import Image

    import tensorstore_cache as tsc

    paths = []
    for i in range(12):
        p = tmp_path / f"{i}.jpg"
        Image.fromarray(np.full((40, 30, 3), i * 20, dtype=np.uint8)).save(p)
        paths.append(str(p))
    log = tmp_path / "decode.log"
    meter = DecodeMeter(tsc.ImageLoader((32, 32)), log)
    assert meter.loader_id == tsc.ImageLoader((32, 32)).loader_id
    assert meter.item_shape == (3, 32, 32)
    here = [meter(p) for p in paths[:4]]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        there = pool.map(meter, paths[4:], chunksize=1)
    np.testing.assert_array_equal(here[0], tsc.ImageLoader((32, 32))(paths[0]))
    assert len(there) == 8
    got = read_log(log)
    assert got["calls"] == 12 and got["cpu_s"] > 0
    assert os.getpid() in got["pids"] and len(got["pids"]) >= 2
    with open(log, "ab") as f:  # a writer killed mid-record leaves a partial record
        f.write(b"\x01\x02")
    assert read_log(log)["calls"] == 12
    assert read_log(tmp_path / "none")["calls"] == 0


def test_failed_trials_in_plain_words() -> None:
    from benchmarks.sweep._sweep_report import failure_notes

    def summary(fails: dict[str, list[str]]) -> dict[str, Any]:
        return {"methods": {name: {"failures": [{"number": i, "outcome": o}
                                                for i, o in enumerate(outcomes)]}
                            for name, outcomes in fails.items()}}

    notes = failure_notes([summary({
        "torch_save": ["killed: out of memory at 8.2 GB", "error: EOFError: Ran out of input",
                       "error: RuntimeError: PytorchStreamReader failed reading zip archive"],
        "tensorstore_cache": [],
        "no_cache": ["killed: SIGKILL"],
    })])
    assert len(notes) == 2
    assert notes[0].startswith("torch_save: trial(s) 0 were killed by the kernel's OOM killer")
    assert notes[1].startswith("torch_save: trial(s) 1, 2 failed reading the cache file while "
                               "another agent was still writing it")
    assert "original method's own defect" in notes[1]
    assert failure_notes([summary({"tensorstore_cache": []})]) == []
