"""The benchmark runs end to end and reports every figure; its image generator is sound.

The end-to-end test runs ``python -m benchmarks.run --quick`` (200 covers, agents
started by a forkserver) in a subprocess, into temporary directories.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from benchmarks.common import make_images
from benchmarks.common._stamp import unstamped
from benchmarks.common._timeline import caller, event_lines
from benchmarks.common.methods import METHODS

from .test_bench_reports import absolute_paths

for _module in ("torch", "pandas", "datasets", "zarr", "psutil", "matplotlib"):
    pytest.importorskip(_module)  # the benchmark's extra dependencies

REPO = Path(__file__).resolve().parents[2]

REQUIRED = (
    "first_agent_s",
    "later_agent_s",
    "open_s",
    "lookup_items_per_s",
    "batch_items_per_s",
    "dataloader_epoch_s",
    "uss_total_bytes_4_agents",
    "pss_total_bytes_4_agents",
    "disk_bytes",
)
CACHES = ("torch_save", "hf_datasets", "zarr_api", "tensorstore_cache", "raw_memmap")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("bench")
    work, results = root / "work", root / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--workdir", str(work),
         "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return work, results, proc.stdout


@pytest.mark.timeout(360)
def test_report_has_every_method_and_figure(quick_run: tuple[Path, Path, str]) -> None:
    _work, results, stdout = quick_run
    report = json.loads((results / "latest.json").read_text())
    assert {"env", "methods", "open_vs_n", "targets"} <= set(report)
    assert list(report["methods"]) == list(METHODS)
    for name, rec in report["methods"].items():
        missing = [k for k in REQUIRED if k not in rec]
        assert not missing, f"{name} lacks {missing}"
        for key in ("first_agent_s", "later_agent_s", "lookup_items_per_s",
                    "batch_items_per_s", "dataloader_epoch_s", "uss_total_bytes_4_agents",
                    "pss_total_bytes_4_agents"):
            assert isinstance(rec[key], (int, float)) and rec[key] > 0, (name, key, rec[key])
        assert rec["dataloader_items"] == report["env"]["sizes"]["unique_paths"], name
        assert sorted(rec["memory"], key=int) == ["1", "2", "4"], name
        assert len(rec["memory"]["4"]["agents_uss_bytes"]) == 4, name
        assert list(rec["rounds"]) == ["first", "1", "2", "4"], name
        assert {r["status"] for r in rec["rounds"].values()} == {"ok"}, (name, rec["rounds"])
        assert rec["rounds"]["4"]["oom_score_adj"] == [1000] * 5, name  # 4 agents + baseline
        assert "need_bytes" in rec["rounds"]["4"]["guard"], name
    for name in CACHES:
        rec = report["methods"][name]
        assert rec["first_agent_hit"] is False, f"{name}: the first agent found a cache"
        assert rec["later_agent_hit"] is True, f"{name}: the later agent missed its cache"
        assert rec["open_s"] > 0 and rec["disk_bytes"] > 0, name
        sizes = report["open_vs_n"][name]
        assert len(sizes) == 3 and all(v["open_s"] > 0 and v["hit"] for v in sizes.values())
    for name in ("no_cache", "manager_pil", "manager_vectors"):
        assert report["methods"][name]["disk_bytes"] is None
    # every method's first agent again, in 2 interleaved rounds (the second in a rotated order)
    rounds = report["first_rounds"]
    names = list(METHODS)
    assert rounds["rounds"] == 2 and rounds["orders"] == [names, names[1:] + names[:1]]
    for name, per in rounds["methods"].items():
        assert len(per["s"]) == 2 and all(s > 0 for s in per["s"]), (name, per)
        assert all(c > 0 for c in per["cpu_s"]) and per["failures"] == [], (name, per)
        rec = report["methods"][name]
        assert rec["first_agent_s"] == per["median_s"], name  # the targets compare medians
        assert rec["first_agent_once_s"] > 0, name
    # the batches the target compares again, in 2 interleaved rounds: their medians count
    batch = report["batch_rounds"]
    pair = ["tensorstore_cache", "raw_memmap"]
    assert batch["rounds"] == 2 and batch["orders"] == [pair, pair[::-1]]
    for name, per in batch["methods"].items():
        assert len(per["items_per_s"]) == 2 and per["failures"] == [], (name, per)
        assert all(v > 0 for v in per["items_per_s"]), (name, per)
        rec = report["methods"][name]
        assert rec["batch_items_per_s"] == per["median_items_per_s"], name
        assert rec["batch_items_once_per_s"] > 0, name
    env = report["env"]
    assert env["cores"] >= 1 and env["ram_bytes"] > 0 and env["cpu"] and env["python"]
    for pkg in ("numpy", "torch", "zarr", "datasets"):
        assert env["versions"][pkg], pkg
    run = report["stamp"]  # the code it measured
    assert len(run["commit"]) == 40 and run["command"] == env["command"], run
    assert all(rec["stamp"] == run for rec in report["methods"].values())
    assert len(report["targets"]) == 9
    assert {t["status"] for t in report["targets"].values()} <= {"PASS", "MISS", "n/a"}
    table = (results / "latest.md").read_text()
    assert table.strip() in stdout
    assert "## Failures" not in table
    for name in METHODS:
        assert f"| {name} |" in table
    assert "weights_only=False" in table
    assert "## First agents, 2 interleaved rounds" in table
    assert "## Random batches of 256, 2 interleaved rounds" in table
    # written as anyone can rerun it: no directory of this machine, the command included
    assert (report["config"]["workdir"], report["config"]["results"]) == ("<workdir>", "<results>")
    assert "--workdir <workdir> --results <results>" in report["env"]["command"]
    assert absolute_paths((results / "latest.json").read_text()) == []
    assert absolute_paths(table) == []


@pytest.mark.timeout(360)
def test_every_method_returns_the_decoded_vectors(quick_run: tuple[Path, Path, str]) -> None:
    work, results, _ = quick_run
    report = json.loads((results / "latest.json").read_text())
    assert all(rec["vectors_equal_no_cache"] is True for rec in report["methods"].values())
    # and directly: tensorstore_cache's first (building) and later (opening) agents
    # gathered exactly what decoding every image gives
    ref = np.load(work / "verify" / "no_cache-first.npy")
    assert ref.shape == (report["env"]["sizes"]["unique_paths"], 3, 32, 32)
    assert ref.dtype == np.float32 and ref.min() >= 0.0 and ref.max() <= 1.0 and ref.std() > 0.05
    for stage in ("first", "later"):
        got = np.load(work / "verify" / f"tensorstore_cache-{stage}.npy")
        np.testing.assert_array_equal(got, ref)


@pytest.mark.timeout(360)
def test_plots_are_written(quick_run: tuple[Path, Path, str]) -> None:
    _work, results, _ = quick_run
    for name in ("time_to_vectors.png", "memory_vs_agents.png", "open_vs_n.png"):
        data = (results / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != make_images.MANIFEST:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_make_images_is_deterministic_and_varied(tmp_path: Path) -> None:
    n = 120
    a, b = tmp_path / "a", tmp_path / "b"
    make_images.generate(a, n, seed=3, workers=1, quiet=True)
    make_images.generate(b, n, seed=3, workers=2, quiet=True)
    assert _digest(a) == _digest(b)
    make_images.generate(tmp_path / "c", n, seed=4, workers=1, quiet=True)
    assert _digest(a) != _digest(tmp_path / "c")

    with open(a / make_images.RATINGS, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["user_id", "isbn", "img_path", "rating"]
    refs = Counter(r["img_path"] for r in rows)
    files = {str(p.relative_to(a)) for p in (a / "images").rglob("*.*")}
    assert set(refs) == files and len(files) == n  # every cover referenced, nothing else
    assert min(refs.values()) >= 1 and max(refs.values()) <= make_images.MAX_REFS
    assert len(rows) > n  # covers repeat, as in the ratings data
    assert [r["img_path"] for r in rows] != sorted(r["img_path"] for r in rows)
    assert all(1 <= int(r["rating"]) <= 10 for r in rows)

    modes: Counter[str] = Counter()
    sizes = set()
    for rel in files:
        assert rel.count("/") == 3  # images/xx/yy/name
        with Image.open(a / rel) as img:
            modes[img.mode] += 1
            sizes.add(img.size)
            assert 60 <= img.size[0] <= 120 and 90 <= img.size[1] <= 180
            assert (img.format == "PNG") == rel.endswith(".png")
    assert modes["L"] >= 2 and modes["P"] >= 1 and modes["RGBA"] >= 1
    assert modes["RGB"] > n * 0.9 and len(sizes) > n // 2


def test_make_images_skips_a_complete_set(tmp_path: Path) -> None:
    out = tmp_path / "d"
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)
    manifest = json.loads((out / make_images.MANIFEST).read_text())
    assert manifest["images"] == 20 and manifest["seed"] == 0
    victim = next((out / "images").rglob("*.jpg"))
    victim.unlink()
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)  # same parameters: skipped
    assert not victim.exists()
    assert not make_images.is_complete(out, 21, 0)
    (out / make_images.MANIFEST).unlink()  # an interrupted run has no manifest: regenerated
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)
    assert victim.exists()


# --- the records benchmark (benchmarks/records/records.py) ---------------------------------------

RECORD_FIGURES = ("build_s", "disk_bytes", "open_s", "key_map_s", "record_by_key_per_s",
                  "batch_records_per_s", "epoch_s", "uss_growth_bytes_4_readers")


@pytest.fixture(scope="module")
def records_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    """A tiny run: 300 covers; the numpy limit, this project, and a peer whose
    environment is missing (the peers' environments are not needed by the test suite)."""
    root = tmp_path_factory.mktemp("records")
    work, results = root / "work", root / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.records", "--images", "300",
         "--methods", "numpy_limit,tensorstore_cache,litdata", "--open-sizes", "100,400",
         "--open-rounds", "2", "--read-rounds", "2", "--lookup-budget", "0.05",
         "--build-rounds", "2",
         "--workdir", str(work),
         "--results", str(results), "--peers-venv", str(root / "no-such-venv")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads((results / "records.json").read_text())
    assert (results / "records.md").read_text().strip() in proc.stdout
    assert all(m["stamp"] == report["stamp"] for m in report["methods"].values())
    return work, report, proc.stdout


@pytest.mark.timeout(660)
def test_records_numpy_limit_measures_every_figure(
        records_run: tuple[Path, dict[str, Any], str]) -> None:
    _work, report, table = records_run
    assert list(report["methods"]) == ["numpy_limit", "tensorstore_cache", "litdata"]
    rec = report["methods"]["numpy_limit"]
    assert rec["status"] == "ok" and rec["records"] == 300, rec
    for key in RECORD_FIGURES:
        assert isinstance(rec[key], (int, float)) and rec[key] >= 0, (key, rec.get(key))
    assert rec["build_s"] > 0 and rec["batch_records_per_s"] > 0 and rec["disk_bytes"] > 0
    assert rec["batch_s"]["count"] == 200 and rec["batch_s"]["batch_size"] == 256
    assert rec["epoch"]["records"] == 300
    assert rec["batch_types"] == {"image": ["uint8", [256, 3, 32, 32]],
                                  "title_ids": ["int32", [256, rec["batch_types"]["title_ids"][1][1]]],
                                  "rating": ["float32", [256]]}
    assert len(rec["memory"]["readers_memory"]) == 4 and rec["memory"]["readers"] == 4
    assert rec["same_as_numpy_limit"] is True
    opens = report["open_vs_n"]["numpy_limit"]
    assert sorted(opens, key=int) == ["100", "400"]
    assert all(v["status"] == "ok" and v["open_s"] > 0 and len(v["open_s_all"]) == 2
               and v["open_s"] == float(np.median(v["open_s_all"])) for v in opens.values())
    # the read figures are the medians of the read rounds (the first read kept beside)
    rounds = report["read_rounds"]["methods"]["numpy_limit"]
    assert report["read_rounds"]["rounds"] == 2 and not rounds["failures"], rounds
    assert len(rounds["batch_records_per_s"]) == 2 and rec["batch_records_per_s_once"] > 0
    assert rec["batch_records_per_s"] == float(np.median(rounds["batch_records_per_s"]))
    assert report["read_rounds"]["orders"] == [["numpy_limit", "tensorstore_cache"],
                                               ["tensorstore_cache", "numpy_limit"]]
    assert "| numpy_limit |" in table and "## Targets" in table
    assert "## Reads in 2 interleaved rounds" in table
    # against the limit (batches, by key, the open at each size), lance (batches, by key),
    # the 3 other peers (batches), the fastest peer's open at each size, O(1), memory; the
    # build's 2
    assert len(report["targets"]) == 2 + 2 + 3 + 4 + 1 + 1 + 2


@pytest.mark.timeout(660)
def test_records_builds_again_in_rounds_beside_the_decode_only_floor(
        records_run: tuple[Path, dict[str, Any], str]) -> None:
    _work, report, table = records_run
    rounds = report["build_rounds"]
    built = ["numpy_limit", "tensorstore_cache", "decode_floor"]  # litdata is not installed
    assert rounds["rounds"] == 2 and rounds["orders"] == [built, built[1:] + built[:1]]
    for name, per in rounds["methods"].items():
        assert len(per["s"]) == 2 and all(s > 0 for s in per["s"]), (name, per)
        assert per["failures"] == [] and per["min_s"] <= per["median_s"] <= per["max_s"]
    for name in built[:2]:
        rec = report["methods"][name]
        assert rec["build_s"] == rounds["methods"][name]["median_s"] and rec["build_once_s"] > 0
    t = report["targets"]
    floor = t["build_vs_decode_floor"]
    assert floor["status"] in ("PASS", "MISS") and floor["threshold"] == 1.15
    assert floor["value"] == pytest.approx(rounds["methods"]["tensorstore_cache"]["median_s"]
                                           / rounds["methods"]["decode_floor"]["median_s"])
    assert t["build_vs_fastest_peer"]["status"] == "n/a"
    assert "no peer built" in t["build_vs_fastest_peer"]["reason"]
    assert "## Builds, 2 interleaved rounds" in table and "| decode_floor |" in table


@pytest.mark.timeout(660)
def test_records_numpy_limit_holds_the_loaders_records(
        records_run: tuple[Path, dict[str, Any], str]) -> None:
    """The reference every method is checked against is itself right: its digests are
    those of the loader's records, gathered and padded here another way."""
    from benchmarks.records import records_data
    from benchmarks.records.records_methods._base import stack_records
    from benchmarks.records.records_methods._child import (
        DIGEST_BATCHES,
        batch_digest,
        record_digest,
    )

    work, report, _ = records_run
    inputs = work / "inputs"
    keys = records_data.read_keys(inputs)
    loader = records_data.RecordLoader(inputs)
    recs = {k: loader(k) for k in keys}
    batches = np.load(work / "batches.npy")
    want = batch_digest(stack_records([recs[keys[i]] for i in rows])
                        for rows in batches[:DIGEST_BATCHES])
    lookups = np.load(work / "lookups.npy")
    want_records = record_digest(recs[keys[i]] for i in lookups[:64])
    rec = report["methods"]["numpy_limit"]
    assert rec["batch_digest"] == want and rec["record_digest"] == want_records
    lengths = [len(r["title_ids"]) for r in recs.values()]
    assert min(lengths) >= 3 and max(lengths) <= 60 and len(set(lengths)) > 10
    assert all(r["image"].shape == (3, 32, 32) and r["image"].dtype == np.uint8
               for r in recs.values())
    assert len({r["image"].tobytes() for r in recs.values()}) == len(recs)


@pytest.mark.timeout(660)
def test_records_failures_are_results(records_run: tuple[Path, dict[str, Any], str]) -> None:
    _work, report, table = records_run
    lit = report["methods"]["litdata"]
    # the missing environment is named, as the report writes paths: by the option's name
    assert lit["status"] == "not installed" and "<peers_venv>" in lit["text"], lit
    t = report["targets"]
    assert t["batch_vs_litdata"]["status"] == "FAILED"
    assert "litdata, build: not installed" in t["batch_vs_litdata"]["reason"]
    assert t["batch_vs_hf_datasets"]["status"] in ("n/a", "FAILED")  # not run
    assert "## Failures" in table and "not installed" in table
    rec = report["methods"]["tensorstore_cache"]  # measured, and right
    assert rec["status"] == "ok", rec
    assert rec["same_as_numpy_limit"] is True, rec.get("same_as_numpy_limit_checks")
    assert all(rec[k] > 0 for k in ("build_s", "batch_records_per_s", "open_s"))
    for name in ("batch_vs_numpy_limit", "memory_4_readers", "open_largest_vs_smallest"):
        assert t[name]["status"] in ("PASS", "MISS"), t[name]


def test_records_targets_compare_within_the_run() -> None:
    from benchmarks.records._records_report import check_records, targets

    def method(rate: float, digest: str = "d") -> dict[str, Any]:
        return {"status": "ok", "phases": {}, "batch_records_per_s": rate,
                "record_by_key_per_s": rate, "batch_digest": digest, "record_digest": digest,
                "epoch": {"records": 3}, "disk_bytes": 1000, "uss_growth_bytes_4_readers": 50}

    methods = {"tensorstore_cache": method(90.0), "numpy_limit": method(100.0),
               "hf_datasets": method(10.0), "litdata": method(30.0, digest="other"),
               "mosaicml_streaming": {"status": "not installed", "text": "not installed: x",
                                      "phases": {"build": {"status": "not installed",
                                                           "text": "not installed: x"}}}}
    check_records(methods)
    opens = {"tensorstore_cache": {"5000": {"status": "ok", "open_s": 0.010},
                                   "80000": {"status": "ok", "open_s": 0.025}}}
    opens["numpy_limit"] = {"5000": {"status": "ok", "open_s": 0.004},
                            "80000": {"status": "ok", "open_s": 0.020}}
    opens["hf_datasets"] = {"5000": {"status": "ok", "open_s": 0.012},
                            "80000": {"status": "ok", "open_s": 0.020}}
    methods["lance"] = method(30.0)
    t = targets(methods, opens, [5000, 80000])
    assert t["batch_vs_numpy_limit"]["status"] == "PASS"
    assert t["batch_vs_numpy_limit"]["value"] == pytest.approx(0.9)
    assert t["batch_vs_hf_datasets"]["status"] == "PASS"  # 9x >= 5x
    assert t["record_by_key_vs_numpy_limit"]["status"] == "PASS"  # 0.9x >= 0.3x
    assert t["batch_vs_lance"]["status"] == "PASS"  # ahead: 3x
    assert t["batch_vs_lance"]["value"] == pytest.approx(3.0)
    assert t["open_5000_vs_numpy_limit"]["status"] == "MISS"  # 2.5x > 2x
    assert t["open_80000_vs_numpy_limit"]["status"] == "PASS"  # 1.25x
    assert t["open_5000_vs_peers"]["status"] == "PASS"  # below hf_datasets'
    assert "hf_datasets" in t["open_5000_vs_peers"]["description"]
    assert t["open_80000_vs_peers"]["status"] == "MISS"  # 0.025 s, not below 0.020 s
    assert t["batch_vs_litdata"]["status"] == "FAILED"  # its records differ
    assert "litdata returned other records" in t["batch_vs_litdata"]["reason"]
    assert t["batch_vs_mosaicml_streaming"]["status"] == "FAILED"
    assert "not installed: x" in t["batch_vs_mosaicml_streaming"]["reason"]
    assert t["memory_4_readers"]["status"] == "PASS"  # 0.05 <= 0.1
    assert t["open_largest_vs_smallest"]["status"] == "MISS"  # 2.5x > 2x


# --- the embedding benchmark (benchmarks/embed/embed.py) ---------------------------------------


@pytest.mark.timeout(660)
def test_embed_runs_every_method_and_checks_its_embeddings(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.embed", "--images", "80", "--batch-size", "32",
         "--threads", "1", "--rounds", "2", "--workdir", str(tmp_path / "work"),
         "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((results / "embed.json").read_text())
    assert (results / "embed.md").read_text().strip() in proc.stdout
    assert all(m["stamp"] == report["stamp"] for m in report["methods"].values())
    assert report["limit"]["status"] == "ok" and report["limit"]["limit_s"] > 0
    assert report["limit"]["limit_s"] == max(report["limit"]["limit_s_rounds"])
    # the forward pass timed again as a device worker runs it: a second, stricter limit
    device = report["limit_as_device_worker"]
    assert device["status"] == "ok" and device["forward_s"] > 0
    assert device["limit_s"] == max(device["limit_s_rounds"])
    assert "OMP_WAIT_POLICY" in device["env"] or "OMP_WAIT_POLICY" in os.environ
    assert "as a device worker runs it" in proc.stdout
    assert set(report["methods"]) == {"tensorstore_cache", "hf_datasets", "per_item"}
    for name, method in report["methods"].items():
        assert method["status"] == "ok", (name, method)
        assert method["same_as_model"] is True and method["later_same"] is True, name
        assert method["build_s"] > 0 and method["later_s"] > 0
        # two rounds, and the figure is the slower one's (the median of two)
        assert len(method["build_s_rounds"]) == len(method["later_s_rounds"]) == 2
        assert method["build_s"] == max(method["build_s_rounds"])
        assert method["build_memory"]["main_peak_rss_bytes"] > 0
    # the batched build: the builder, one CPU worker and one device worker
    assert len(report["methods"]["tensorstore_cache"]["build_memory"]["worker_peak_rss_bytes"]) >= 2
    assert {t["status"] for t in report["targets"].values()} <= {"PASS", "MISS"}
    assert set(report["targets"]) == {"batched_vs_per_item", "batched_vs_limit",
                                      "batched_vs_limit_as_device_worker"}
    assert str(tmp_path) not in json.dumps(report)  # paths are portable


@pytest.mark.timeout(360)
def test_embed_timeline_stamps_every_stage_of_a_batched_build(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.embed.embed_timeline", "--images", "40", "--batch-size",
         "16", "--threads", "1", "--workdir", str(tmp_path / "work"),
         "--results", str(tmp_path / "results")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "embed-timeline.json").read_text())
    assert unstamped(report) == [] and "embed_timeline --images 40" in report["stamp"]["command"]
    (written,) = report["figures"]["sizes"]
    assert written["covers"] == 40 and all(e in proc.stdout for e in written["events"])
    events = event_lines(proc.stdout)
    times = [t for t, _pid, _cpu, _what in events]
    assert times == sorted(times)
    what = [w for _t, _pid, _cpu, w in events]
    calling = caller(events, "cached() called")  # its first event, though not always the first
    mine = [w for _t, pid, _cpu, w in events if pid == calling]
    assert mine[0] == "cached() called" and mine[-1] == "cached() returned", what
    for stage in ("device worker: process started", "device worker: loader received",
                  "setup started", "setup ended", "first item prepared",
                  "first batch of 16", "last batch of 8 (3 batches)"):
        assert stage in what, (stage, what)
    assert what.index("setup ended") < what.index("first batch of 16")
    cpu = {w: c for _t, _pid, c, w in events if c is not None}
    assert len(cpu) == len(set(what)), proc.stdout  # every event line has its CPU seconds
    # the device worker's CPU grows from its start through its set-up (torch, the model)
    assert cpu["device worker: process started"] == 0.0
    assert 0 < cpu["device worker: loader received"] <= cpu["setup ended"]
    assert re.search(r"^CPU: building process [\d.]+ s during the call, the workers it reaped "
                     r"[\d.]+ s", proc.stdout, re.M), proc.stdout


def test_records_build_targets_take_the_fastest_peer_and_the_floor() -> None:
    from benchmarks.records._records_build import apply, targets

    def per(median: float | None) -> dict[str, Any]:
        return {"s": [median], "failures": [] if median else ["round 1: error: x"],
                "median_s": median, "min_s": median, "max_s": median}

    rounds: dict[str, Any] = {"rounds": 5, "orders": [], "methods": {
        "tensorstore_cache": per(3.0), "hf_datasets": per(2.9), "mosaicml_streaming": per(3.5),
        "litdata": per(None), "numpy_limit": per(2.0), "decode_floor": per(2.7)}}
    t = targets(rounds)
    fastest = t["build_vs_fastest_peer"]
    assert fastest["value"] == pytest.approx(3.0 / 2.9) and fastest["status"] == "MISS"
    assert "(hf_datasets)" in fastest["description"]  # the numpy limit is not a peer
    floor = t["build_vs_decode_floor"]
    assert floor["value"] == pytest.approx(3.0 / 2.7) and floor["status"] == "PASS"
    methods: dict[str, Any] = {"tensorstore_cache": {"build_s": 9.0}}
    apply(methods, rounds)
    assert methods["tensorstore_cache"] == {"build_s": 3.0, "build_once_s": 9.0}
    rounds["methods"]["tensorstore_cache"] = per(None)
    failed = targets(rounds)["build_vs_decode_floor"]
    assert failed["status"] == "FAILED" and "error: x" in failed["reason"]
    assert targets(None) == {}
