"""Every figure of the README's headline table and of the tables of ``docs/benchmarks.md`` is
the committed result it quotes, rounded once (:mod:`tests.support.figures`); so is every
figure the guarantees page quotes (the long soak's counts, the guarantees benchmark's times
and memory).

Each table is named by its header line and matched with its results file by a
:class:`~tests.support.figures.TableSpec`: which row is which method, and what each column
shows. A figure edited by hand, rounded twice (10.9476 shown as 11.0 after 10.95), or left
from an earlier run fails here with the value it should show. A table whose results file is
not committed yet (its benchmark writes one since the results were stamped) is an expected
failure naming the command that writes it, until that run is committed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from benchmarks.common._timeline import caller, event_lines

from ..support.figures import REPO, TableSpec, check_cell, check_table, clean, rounded_once

MIB = float(2**20)
README, BENCH = "README.md", "docs/benchmarks.md"


def _runs(key: str, scale: float = 1.0) -> Any:
    """A figure of the sweep's summary, one per run."""
    def show(r: Mapping[str, Any], method: str) -> list[float | None]:
        return [None if run["methods"][method][key] is None else run["methods"][method][key] / scale
                for run in r["sweep"]["summary"]]
    return show


SWEEP_ROWS = {"no cache": "no_cache", "Manager().dict() of vectors": "manager_vectors",
              "torch.save of the Series": "torch_save", "Hugging Face datasets.map": "hf_datasets"}
HEADLINE_COLUMNS = {
    "sweep wall s": _runs("wall_s"),
    "later trial: getting data s": _runs("later_data_s"),
    "first round: decode CPU s": _runs("first_round_decode_cpu_s"),
    "node peak memory MiB": _runs("peak_node_bytes", MIB),
    "written to disk MiB": _runs("write_bytes", MIB),
}


def _headline(page: str) -> TableSpec:
    return TableSpec(page, "| method | sweep wall s | later trial: getting data s | first round: "
                           "decode CPU s | node peak memory MiB | written to disk MiB |",
                     {"sweep": "benchmarks/results/sweep/sweep.json"},
                     {**SWEEP_ROWS, "tensorstore_cache (tsc.cached())": "tensorstore_cache"},
                     HEADLINE_COLUMNS)


def _per_datasets(r: Mapping[str, Any], method: str) -> list[float]:
    runs = r["sweep"]["summary"]
    if method == "hf_datasets":
        return [1.0]
    return [run["methods"][method]["later_data_s"] / run["methods"]["hf_datasets"]["later_data_s"]
            for run in runs]


def _method(key: str, scale: float = 1.0, source: str = "run") -> Any:
    """A figure of a method's record in the main benchmark's report."""
    def show(r: Mapping[str, Any], method: str) -> float | None:
        value = r[source]["methods"][method].get(key)
        return None if value is None else value / scale
    return show


def _same(r: Mapping[str, Any], method: str) -> str:
    value = r["run"]["methods"][method].get("vectors_equal_no_cache")
    return "yes" if value else ("-" if value is None else "NO")


def _target(field: str) -> Any:
    def show(r: Mapping[str, Any], description: str) -> Any:
        (t,) = [t for t in r["run"]["targets"].values() if t["description"] == description]
        return t[field]
    return show


def _open(r: Mapping[str, Any], key: tuple[str, str, str]) -> float | None:
    method, size, what = key
    value = r["run"]["open_vs_n"][method].get(size, {}).get(what)
    return None if value is None else float(value)


def _open_columns(sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        out[f"open s @ {n:,}"] = lambda r, m, n=n: _open(r, (m, str(n), "open_s"))
        out[f"hold column s @ {n:,}"] = lambda r, m, n=n: _open(r, (m, str(n), "load_s"))
    return out


def _memory(k: str, key: str) -> Any:
    """A round's memory growth at the original scale, or what happened to the round."""
    def show(r: Mapping[str, Any], method: str) -> Any:
        rec = r["run"]["methods"][method]
        value = rec.get("memory", {}).get(k, {}).get(key)
        if value is None:
            return rec["rounds"][k]["text"]
        return value
    return show


METHODS = ["no_cache", "manager_pil", "manager_vectors", "torch_save", "hf_datasets", "zarr_api",
           "tensorstore_cache", "raw_memmap"]
MAIN = "benchmarks/results/run/latest.json"
MAIN_TARGETS = [
    "later agent: torch_save time / tensorstore_cache time",
    "later agent: manager_vectors time / tensorstore_cache time",
    "single lookups/s: tensorstore_cache / manager_vectors",
    "single lookups/s: tensorstore_cache / hf_datasets",
    "random batch of 256, items/s: tensorstore_cache / raw_memmap",
    "4 agents' total private memory growth / tensorstore_cache store size",
    "first agent: no_cache time / tensorstore_cache time (build, 2 workers)",
    "first agent: tensorstore_cache time / hf_datasets time (both build with 2 workers)",
    "tensorstore_cache open time at 80000 items / at 5000 items",
]


def _micro_open(part: str) -> Any:
    def show(r: Mapping[str, Any], _row: Any) -> float:
        o = r["micro"]["open"]
        small, large = sorted(o, key=int)
        if part == "ratio":
            return float(o[large]["open_s_median"] / o[small]["open_s_median"])
        return float(o[large if part == "store" else small]["open_s_median"])
    return show


def _micro_row(part: str) -> Any:
    def show(r: Mapping[str, Any], row: Any) -> Any:
        if row == "open":
            return _micro_open(part)(r, row)
        section, keys = row
        return r["micro"][section][keys[part]]
    return show


MICRO_ROWS = {
    "build 20,000 covers, 2 workers vs 1":
        ("build", {"store": "workers_2_s", "reference": "workers_1_s", "ratio": "speedup_2_over_1"}),
    "open in a fresh process, 50,000 vs 5,000 items": "open",
    "single lookups/s by path (50,000 items), vs dict + memmap view":
        ("access", {"store": "lookup_store_per_s", "reference": "lookup_dict_memmap_per_s",
                    "ratio": "lookup_ratio"}),
    "rows() of 100,000 paths, keys/s, vs dict lookups into an int64 array":
        ("access", {"store": "rows_keys_per_s", "reference": "rows_dict_keys_per_s",
                    "ratio": "rows_ratio"}),
    "rows() of the 20,000 cover paths (each once), keys/s, vs dict lookups":
        ("covers", {"store": "unique_keys_per_s", "reference": "unique_dict_keys_per_s",
                    "ratio": "unique_ratio"}),
    "rows() of the 47,887 ratings rows (cover paths repeated), keys/s, vs dict lookups":
        ("covers", {"store": "ratings_keys_per_s", "reference": "ratings_dict_keys_per_s",
                    "ratio": "ratings_ratio"}),
    "take 256 random rows, items/s, vs np.memmap fancy index":
        ("access", {"store": "take_256_items_per_s", "reference": "memmap_gather_256_items_per_s",
                    "ratio": "take_ratio"}),
    "take 256 random rows into out=, items/s, vs np.memmap fancy index":
        ("access", {"store": "take_256_out_items_per_s",
                    "reference": "memmap_gather_256_items_per_s", "ratio": "take_out_ratio"}),
}


def _embed(method: str) -> Any:
    def show(r: Mapping[str, Any], run: str) -> list[float]:
        rec = r[run]["methods"][method] if method != "limit" else r[run]["limit"]
        key = "limit_s" if method == "limit" else "build_s"
        return [rec[key], *rec[f"{key}_rounds"]]
    return show


def _embed_target(key: str) -> Any:
    def show(r: Mapping[str, Any], run: str) -> list[Any]:
        t = r[run]["targets"][key]
        return [t["value"], t["status"]]
    return show


def _remote(*path: str, key: str, scale: float = 1.0) -> Any:
    def show(r: Mapping[str, Any], _row: Any) -> float:
        rec: Any = r["remote"]
        for p in path:
            rec = rec[p]
        return float(rec[key]) / scale
    return show


#: the remote table: each row, what each of its columns shows
REMOTE_ROWS: dict[str, dict[str, list[Any]]] = {
    "one batch of 256 random rows": {
        "lazy: time": [_remote("figures", "first_batch", "lazy", key="first_batch_s")],
        "lazy: bytes (requests)": [_remote("figures", "first_batch", "lazy", key="served_bytes"),
                                   _remote("figures", "first_batch", "lazy", key="requests")],
        "whole copy first: time": [_remote("figures", "first_batch", "whole", key="first_batch_s")],
        "bytes": [_remote("figures", "first_batch", "whole", key="served_bytes"),
                  _remote("figures", "first_batch", "whole", key="requests")]},
    "1 % of rows, one range of paths": {
        "lazy: time": [_remote("figures", "fraction", "0.01-contiguous", key="total_s")],
        "lazy: bytes (requests)": [
            _remote("figures", "fraction", "0.01-contiguous", key="served_bytes"),
            _remote("figures", "fraction", "0.01-contiguous", key="requests")]},
    "10 % of rows, one range of paths": {
        "lazy: time": [_remote("figures", "fraction", "0.1-contiguous", key="total_s")],
        "lazy: bytes (requests)": [
            _remote("figures", "fraction", "0.1-contiguous", key="served_bytes"),
            _remote("figures", "fraction", "0.1-contiguous", key="requests")]},
    "1 % of rows, random": {
        "lazy: time": [_remote("figures", "fraction", "0.01", key="total_s")],
        "lazy: bytes (requests)": [_remote("figures", "fraction", "0.01", key="served_bytes"),
                                   _remote("figures", "fraction", "0.01", key="requests")]},
    "10 % / 100 % of rows, random": {
        "lazy: time": [_remote("figures", "fraction", "0.1", key="total_s"),
                       _remote("figures", "fraction", "1.0", key="total_s")],
        "lazy: bytes (requests)": [_remote("figures", "fraction", "1.0", key="served_bytes"),
                                   _remote("figures", "fraction", "1.0", key="requests")],
        "whole copy first: time": [_remote("figures", "fraction", "whole", key="total_s")],
        "bytes": [_remote("figures", "fraction", "whole", key="served_bytes"),
                  _remote("figures", "fraction", "whole", key="requests")]},
}


def _remote_column(name: str) -> Any:
    def show(r: Mapping[str, Any], row: str) -> Any:
        parts = REMOTE_ROWS[row].get(name)
        if parts is None:
            return None
        return [p(r, row) for p in parts]
    return show


def _events(lines: list[str]) -> list[tuple[float, int, str]]:
    """``(seconds, pid, what)`` of a timeline's event lines."""
    return [(t, pid, what) for t, pid, _cpu, what in event_lines("\n".join(lines))]


#: a stage of the cold timeline's table: which process, and the start of its event's text
COLD_STAGES = {
    "pool started (returns)": ("builder", "pool start returned"),
    "building process: first item": ("builder", "first item"),
    "worker: process started": ("worker", "process started"),
    "worker: imports done, first item": ("worker", "imports done, loader received"),
    "building process: last item": ("builder", "last stamped item"),
    "worker: last item": ("worker", "last stamped item"),
    "pool closed (worker exited)": ("builder", "pool close returned"),
    "published": ("builder", "publish returned"),
    "opened, call returned": ("builder", "returned"),
}


def _cold(kind: str, round_: int = 2) -> Any:
    def show(r: Mapping[str, Any], stage: str) -> float | None:
        (rec,) = [x for x in r["cold"]["figures"]["rounds"]
                  if x["kind"] == kind and x["round"] == round_]
        events = _events(rec["events"])
        builder = caller(events)
        who, what = COLD_STAGES[stage]
        return next((t for t, pid, w in events
                     if w.startswith(what) and (pid == builder) == (who == "builder")), None)
    return show


def _first_read(key: str, limit: bool = False) -> Any:
    """A median of the first read's rounds (ms), of a store or (``limit``) of its numpy limit."""
    def show(r: Mapping[str, Any], row: tuple[str, int]) -> float:
        kind, n = row
        name = f"{kind}, numpy limit" if limit else kind
        (rec,) = [x for x in r["read"]["figures"]["stores"] if (x["kind"], x["rows"]) == (name, n)]
        return float(rec["medians_ms"][key])
    return show


def _first_read_over_limit(r: Mapping[str, Any], row: tuple[str, int]) -> float:
    """A store's open + first take over its numpy limit's (medians)."""
    return float(_first_read("open_first_ms")(r, row)
                 / _first_read("open_first_ms", limit=True)(r, row))


def _embed_events(r: Mapping[str, Any], covers: int) -> list[tuple[float, int, str]]:
    (rec,) = [x for x in r["timeline"]["figures"]["sizes"] if x["covers"] == covers]
    return _events(rec["events"])


def _embed_stage(stage: str) -> Any:
    def show(r: Mapping[str, Any], covers: int) -> Any:
        events = _embed_events(r, covers)
        at = {w: t for t, _pid, w in events}
        calling = caller(events, "cached() called")
        if stage == "setup":
            return [at["setup started"], at["setup ended"]]
        if stage == "pool":
            pool = [t for t, pid, w in events if w == "first item prepared" and pid != calling]
            return pool[:1] or "- (all by the calling process)"
        if stage == "last":
            t, _pid, w = next(e for e in events if e[2].startswith("last batch"))
            return [t, int(w.rsplit("(", 1)[1].split()[0])]
        return next(t for t, _pid, w in events if w.startswith(stage))
    return show


SPECS: dict[str, TableSpec] = {
    "README headline": _headline(README),
    "headline": _headline(BENCH),
    "later trials": TableSpec(
        BENCH, "| method | getting data s | of which the vectors s |",
        {"sweep": "benchmarks/results/sweep/sweep-later-trials.json"},
        {"Hugging Face datasets.map": "hf_datasets",
         'tensorstore_cache, identity="stat" (the default)': "tensorstore_cache",
         'tensorstore_cache, identity="none"': "tensorstore_cache_none"},
        {"getting data s": _runs("later_data_s"), "of which the vectors s": _runs("later_vectors_s"),
         "/ datasets": _per_datasets}),
    "main": TableSpec(
        BENCH, "| method | first agent s | later agent s | open s |", {"run": MAIN},
        {m: m for m in METHODS},
        {"first agent s": _method("first_agent_s"), "later agent s": _method("later_agent_s"),
         "open s": _method("open_s"), "lookups/s": _method("lookup_items_per_s"),
         "batch-256 items/s": _method("batch_items_per_s"),
         "DataLoader epoch s": _method("dataloader_epoch_s"), "full pass s": _method("full_pass_s"),
         "USS 4 agents MiB": _method("uss_total_bytes_4_agents", MIB),
         "PSS 4 agents MiB": _method("pss_total_bytes_4_agents", MIB),
         "USS growth 4 agents MiB": _method("uss_growth_bytes_4_agents", MIB),
         "disk MiB": _method("disk_bytes", MIB), "= no_cache": _same}),
    "main targets": TableSpec(
        BENCH, "| target | value | wanted | status |", {"run": MAIN}, {d: d for d in MAIN_TARGETS},
        {"value": _target("value"), "wanted": _target("threshold"), "status": _target("status")}),
    "open vs N": TableSpec(
        BENCH, "| method | open s @ 5,000 |", {"run": MAIN},
        {m: m for m in ("torch_save", "hf_datasets", "zarr_api", "tensorstore_cache", "raw_memmap")},
        _open_columns([5000, 20000, 80000])),
    "original scale": TableSpec(
        BENCH, "| method | first agent | later agent | 1 agent, private |",
        {"run": "benchmarks/results/run/original-scale.json"}, {m: m for m in METHODS},
        {"first agent": _method("first_agent_s"), "later agent": _method("later_agent_s"),
         "1 agent, private": _memory("1", "uss_growth_bytes"),
         "4 agents, private": _memory("4", "uss_growth_bytes"),
         "4 agents, PSS": _memory("4", "pss_growth_bytes"), "disk": _method("disk_bytes")}),
    "sweep original scale": TableSpec(
        BENCH, "| method | sweep wall s | later trial: getting data s | first round: decode CPU s "
               "| node peak memory MiB | trials ok |",
        {"sweep": "benchmarks/results/sweep/sweep-original.json"},
        {**SWEEP_ROWS, "tensorstore_cache": "tensorstore_cache"},
        {**{k: v for k, v in HEADLINE_COLUMNS.items() if k != "written to disk MiB"},
         "trials ok": lambda r, m: [x for run in r["sweep"]["summary"]
                                    for x in (run["methods"][m]["ok"], run["methods"][m]["trials"])]}),
    "micro": TableSpec(
        BENCH, "| measurement | tensorstore_cache | reference | ratio |",
        {"micro": "benchmarks/results/micro/micro.json"}, MICRO_ROWS,
        {"tensorstore_cache": _micro_row("store"), "reference": _micro_row("reference"),
         "ratio": _micro_row("ratio")}),
    "embeddings": TableSpec(
        BENCH, "| run | `tensorstore_cache` | `hf_datasets` | `per_item` | the limit |",
        {"default": "benchmarks/results/embed/embed.json",
         "threads1": "benchmarks/results/embed/embed-threads1.json"},
        {"torch's default threads": "default", "--threads 1": "threads1"},
        {"tensorstore_cache": _embed("tensorstore_cache"), "hf_datasets": _embed("hf_datasets"),
         "per_item": _embed("per_item"), "the limit": _embed("limit"),
         "per_item / batched (>= 2)": _embed_target("batched_vs_per_item"),
         "batched / limit (<= 1.2)": _embed_target("batched_vs_limit")}),
    "remote": TableSpec(
        BENCH, "| a fresh process reads | lazy: time | lazy: bytes (requests) |",
        {"remote": "benchmarks/results/remote/remote.json"}, {row: row for row in REMOTE_ROWS},
        {name: _remote_column(name) for name in ("lazy: time", "lazy: bytes (requests)",
                                                 "whole copy first: time", "bytes")},
        generated=("python -m benchmarks.remote --n 20000 --repeat 3",)),
    "cold timeline": TableSpec(
        BENCH, "| stage | covers | records |", {"cold": "benchmarks/results/cold/timeline.json"},
        {stage: stage for stage in COLD_STAGES},
        {"covers": _cold("covers"), "records": _cold("records")},
        generated=("python -m benchmarks.cold.cold_timeline --rounds 2",)),
    "first read": TableSpec(
        BENCH, "| store | rows | open_store | first take | open + first take |",
        {"read": "benchmarks/results/cold/first-read.json"},
        {f"{kind} | {n:,}": (kind, n) for n in (5000, 80000) for kind in ("records", "tensors")},
        {"open_store": _first_read("open_ms"), "first take": _first_read("first_take_ms"),
         "open + first take": _first_read("open_first_ms"),
         "numpy limit: open + first take": _first_read("open_first_ms", limit=True),
         "over the numpy limit": _first_read_over_limit,
         "first record by key": _first_read("first_key_ms")},
        generated=("python -m benchmarks.cold.first_read --rounds 5",),
        label_cells=2),
    "embedding timeline": TableSpec(
        BENCH, "| covers | device worker's `setup`",
        {"timeline": "benchmarks/results/embed/embed-timeline.json"}, {"20,000": 20000},
        {"device worker's setup (imports torch, builds the model)": _embed_stage("setup"),
         "first batch": _embed_stage("first batch"),
         "first item prepared by the CPU pool": _embed_stage("pool"),
         "last batch": _embed_stage("last"), "cached() returns": _embed_stage("cached() returned")},
        generated=("python -m benchmarks.embed.embed_timeline --images 20000",)),
}
@pytest.mark.parametrize("name", list(SPECS))
def test_every_figure_of_a_table_is_its_result_rounded_once(name: str) -> None:
    spec = SPECS[name]
    absent = [path for path in spec.sources.values() if not (REPO / path).exists()]
    if absent:
        pytest.xfail(f"{', '.join(absent)} not committed yet: run "
                     f"{'; '.join(spec.generated) or 'its benchmark'} and commit its results")
    problems = check_table(spec)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("shown", "unit", "value", "ok"),
    [("10.95", "", 10.9476143, True), ("11.0", "", 10.9476143, False), ("10.9", "", 10.9476143, True),
     ("632.4", "ms", 0.63240, True), ("14k", "", 0, False), ("14", "k", 14_210.0, True),
     ("1,908.9", "", 1908.87, True), ("1", "x", 0.998, True), ("2.63", "GB", 2.634e9, True),
     ("65.2", "%", 0.6524, True), ("763", "x", 762.6, True), ("763", "x", 762.4, False)],
)
def test_a_figure_is_rounded_once(shown: str, unit: str, value: float, ok: bool) -> None:
    assert rounded_once(shown, unit, value) is ok


def test_a_cell_shows_its_figures_words_or_nothing() -> None:
    assert check_cell("**56.2 / 67.3**", [56.19, 67.29]) is None
    assert "rounded once" in str(check_cell("11.0 / 11.1", [10.9476, 11.1094]))
    assert "2 figures shown" in str(check_cell("1.0 / 2.0", [1.0]))
    assert check_cell("13.1 s (13.1, 13.8, 12.9)", [13.054, 13.054, 13.798, 12.858]) is None
    assert check_cell("11.4 PASS", [11.403, "PASS"]) is None
    assert "'PASS' is missing" in str(check_cell("11.4 MISS", [11.403, "PASS"]))
    assert check_cell("0.52x / 0.42x (aim <= 0.8x)", [0.5237, 0.4217]) is None
    assert check_cell("-", None) is None and check_cell("- / -", [None, None]) is None
    assert check_cell("killed: out of memory at 6.6 GB", "killed: out of memory at 6.6 GB") is None
    assert check_cell("8/8", [8, 8]) is None
    assert clean("`torch.save` of the **Series**") == "torch.save of the Series"


def _soak(r: Mapping[str, Any], key: str) -> Any:
    soak = r["soak"]
    return {"calls": soak["calls"], "vectors checked": soak["vectors_checked"],
            "kills": soak["kills"]["total"], "builders mid-build": soak["kills"]["builder"],
            "pool workers": soak["kills"]["worker"], "gc,": soak["kills"].get("gc", 0),
            "callers at any moment)": soak["kills"].get("caller", 0),
            "gc runs": soak["gc_runs"], "rewrites": soak["writer"]["rewrites"],
            "wrong vectors": soak["wrong"], "stores lacking a path": soak["missing"],
            "other violations": soak["violation_total"] - soak["wrong"] - soak["missing"]}[key]


def _stopping(event: str, key: str, stat: str) -> Any:
    return lambda r: r["guarantees"]["stopping"][event][key][stat]


def _growth(method: str, mode: str) -> Any:
    return lambda r: [g / MIB for g in r["guarantees"]["sharing"][method][mode]["uss_growth_bytes"]]


#: the figures the guarantees page quotes: the statement, the figure's text before and after
#: it, and what the results say
GUARANTEES: list[tuple[str, str, str, Any]] = [
    *[("`gc` and `cached()` never cross.", "", f" {key}", lambda r, key=key: _soak(r, key))
      for key in ("calls", "vectors checked", "kills", "builders mid-build", "pool workers", "gc,",
                  "callers at any moment)",
                  "gc runs", "rewrites", "wrong vectors", "stores lacking a path",
                  "other violations")],
    ("`gc` and `cached()` never cross.", "the library at commit\n  ", ",",
     lambda r: r["soak"]["stamp"]["commit"]),
    ("Killed builders.", "(", " s after the kill, median",
     _stopping("worker_killed", "handled_s", "median_s")),
    ("Interrupts.", "`except` ran after ", " s", _stopping("sigint", "handled_s", "max_s")),
    ("Interrupts.", "every process was gone after ", " s", _stopping("sigint", "stopped_s", "max_s")),
    ("Interrupts.", "the workers were gone\n  ", " s after SIGTERM",
     _stopping("sigterm", "stopped_s", "max_s")),
    ("Interrupts.", "and ", " s after SIGKILL", _stopping("sigkill", "stopped_s", "max_s")),
    ("Interrupts.", "load average ", " on a", lambda r: r["guarantees"]["env"]["loadavg_at_start"][0]),
    ("Zero copy, shared memory.", "(USS) by ", " MiB each", _growth("spawn", "views")),
    ("Zero copy, shared memory.", "(", " MiB forked from", _growth("fork", "views")),
    ("Zero copy, shared memory.", "against +", " MiB each", _growth("spawn", "copy")),
    ("Zero copy, shared memory.", "copies (", " MiB forked)", _growth("fork", "copy")),
    ("Zero copy, shared memory.", "has ", " MiB of its pages",
     lambda r: r["guarantees"]["sharing"]["fresh"]["one"][1] / MIB),
]


def _shown(statement: str, before: str, after: str, commit: bool = False) -> str:
    """The figure of ``statement`` between ``before`` and ``after`` (a number or a range of
    two; with ``commit``, a commit's hex), spaces and line breaks taken as one space."""
    def flat(text: str) -> str:
        return re.sub(r"\s+", " ", text)

    figure = r"([0-9a-f]{7,40})" if commit else r"(\d[\d.,]*(?:-\d[\d.,]*)?)"
    found = re.findall(re.escape(flat(before)) + figure + re.escape(flat(after)), flat(statement))
    assert len(found) == 1, (before, after, found)
    return str(found[0]).rstrip(".,")


def test_the_guarantees_page_quotes_its_results() -> None:
    from ..support.figures import load
    from ..test_project.test_proofs import PAGE, statements

    items = {title.split(": ", 1)[1]: text for title, text in statements(PAGE.read_text()).items()}
    reports = load({"soak": "benchmarks/results/soak/soak-600s.json",
                    "guarantees": "benchmarks/results/guarantees/guarantees.json"})
    bad = []
    for title, before, after, show in GUARANTEES:
        want = show(reports)
        shown = _shown(items[title], before, after, commit=isinstance(want, str))
        if isinstance(want, str):  # a commit
            ok = len(shown) >= 7 and want.startswith(shown)
        else:
            values = want if isinstance(want, list) else [want]
            low, _, high = shown.partition("-")
            ok = rounded_once(low, "", min(values)) and rounded_once(high or low, "", max(values))
            ok = ok and (bool(high) or all(rounded_once(low, "", v) for v in values))
        if not ok:
            bad.append(f"{title} {before.strip()}...{after.strip()}: {shown} shown, {want!r} run")
    assert not bad, "\n".join(bad)
