"""The reports of the benchmarks, and the main benchmark's: its targets and tables.

What every benchmark's report uses (the main run's, :mod:`benchmarks.records._records_report`'s,
:mod:`benchmarks.embed`'s): the environment of a run, the formats of
figures, ratios and target statuses, the lines of a table, and writing the report and
its markdown with portable paths. Then the main benchmark's target ratios and tables.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from importlib import metadata
from typing import Any

from benchmarks.common._portable import portable
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import cpu_name, machine, now, stamp
from benchmarks.common.methods.torch_save import UNSAFE_NOTE

TSC = "tensorstore_cache"
PACKAGES = ("numpy", "torch", "zarr", "datasets", "pandas", "pyarrow", "pillow", "tensorstore",
            "psutil", "xxhash")


def compile_sources() -> None:
    """Byte-compile this repository's package and benchmarks, as installing a package does.

    An editable install leaves them as sources: where ``PYTHONDONTWRITEBYTECODE`` is set,
    every process a benchmark starts (each worker of a build) would compile them again, at
    about 0.25 s a process on a 2-core machine, which the peers, installed from wheels,
    never pay. Compiled files are kept only while their source is unchanged.
    """
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("tensorstore_cache", "benchmarks"):
        compileall.compile_dir(str(root / name), quiet=1)


def environment() -> dict[str, Any]:
    """CPU, cores, RAM, Python and library versions of this machine."""
    try:
        import psutil

        ram = int(psutil.virtual_memory().total)
    except ImportError:  # torchvision's environment (benchmarks.fingerprint) has no psutil
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": now(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": versions,
    }


def publish(files: ResultsFile, report: dict[str, Any], render: Callable[[dict[str, Any]], str],
            run: dict[str, Any], **places: Any) -> str:
    """Stamp ``report`` with ``run`` (:func:`benchmarks.common._stamp.stamp`), write it and
    its markdown (``render``) as anyone can read them, the run's directories by name
    (``data=...``, see :mod:`benchmarks.common._portable`); return the markdown as
    written."""
    stamp(report, run)
    shown: dict[str, Any] = portable(report, **places)
    return files.save(shown, render(shown))


# -- figures, ratios and targets --------------------------------------------------------


def figure(results: dict[str, Any], method: str, key: str) -> float | None:
    """The number ``results[method][key]``; None if the method or the figure is not there."""
    value = results.get(method, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None where either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def verdict(value: float, op: str, threshold: float) -> str:
    """``PASS`` if ``value op threshold`` holds (``>=``, ``>``, ``<`` or ``<=``), else ``MISS``."""
    if op == ">=":
        return "PASS" if value >= threshold else "MISS"
    if op == ">":
        return "PASS" if value > threshold else "MISS"
    if op == "<":
        return "PASS" if value < threshold else "MISS"
    return "PASS" if value <= threshold else "MISS"


def target(description: str, value: float | None, op: str, threshold: float, status: str,
           reasons: list[str]) -> dict[str, Any]:
    """A target as a report records it; its ``reason``, the reasons joined, if any."""
    out: dict[str, Any] = {"description": description, "value": value, "op": op,
                           "threshold": threshold, "status": status}
    if reasons:
        out["reason"] = "; ".join(reasons)
    return out


def seconds(value: Any) -> str:
    """Seconds: ``120``, ``12.34``, ``5.1 ms``, ``80 us``; ``-`` for None."""
    if value is None:
        return "-"
    v = float(value)
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.001:
        return f"{v * 1000:.1f} ms"
    return f"{v * 1e6:.0f} us"


def rate(value: Any) -> str:
    """Per second: ``1.25M``, ``38k``, ``4.2k``, ``950``; ``-`` for None."""
    if value is None:
        return "-"
    v = float(value)
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def mib(value: Any) -> str:
    """Bytes in MiB: ``1,234.5``; ``-`` for None."""
    if value is None:
        return "-"
    return f"{float(value) / 2**20:,.1f}"


def times(value: Any) -> str:
    """A ratio: ``0.25x``, ``31.4x``, ``1,234x``; ``-`` for None."""
    if value is None:
        return "-"
    v = float(value)
    return f"{v:.3g}x" if v < 1000 else f"{v:,.0f}x"


# -- lines of the tables ----------------------------------------------------------------


def wall_and_load(env: dict[str, Any]) -> str:
    """``(S s, load average at start A, B, C)``."""
    load = ", ".join(f"{x:.1f}" for x in env.get("loadavg_at_start") or [])
    return f"({env.get('wall_s', 0):.0f} s, load average at start {load})"


def same(value: bool | None) -> str:
    """A check's cell: ``yes``, ``NO``, or ``-`` where it was not made."""
    return "yes" if value else ("-" if value is None else "NO")


def target_table(targets: dict[str, Any], value: Callable[[dict[str, Any]], str]) -> list[str]:
    """The section of the targets, each target's value cell written by ``value``."""
    lines = ["", "## Targets (ratios within this run)", "",
             "| target | value | wanted | status |", "|---|---:|---:|:---:|"]
    for t in targets.values():
        lines.append(f"| {t['description']} | {value(t)} | {t['op']} {t['threshold']:g}x "
                     f"| {t['status']} |")
    return lines


# -- the main benchmark -----------------------------------------------------------------


#: the round each figure of a method's record comes from
FIGURE_ROUND = {
    "first_agent_s": "first", "disk_bytes": "first",
    "later_agent_s": "1", "open_s": "1", "lookup_items_per_s": "1", "batch_items_per_s": "1",
    "dataloader_epoch_s": "1", "full_pass_s": "1",
    "uss_total_bytes_4_agents": "4", "pss_total_bytes_4_agents": "4",
    "uss_growth_bytes_4_agents": "4", "anon_growth_bytes_4_agents": "4",
}
ROUND_NAMES = {"first": "first agent", "1": "1 agent"}


def round_name(key: str) -> str:
    """``"first agent"``, ``"1 agent"``, ``"4 agents"``."""
    return ROUND_NAMES.get(key, f"{key} agents")


def missing(rec: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The record of the failed or skipped round that left figure ``key`` out, if any."""
    if not rec:
        return None
    rnd = rec.get("rounds", {}).get(FIGURE_ROUND.get(key, ""))
    if rnd and rnd.get("status", "ok") != "ok":
        return dict(rnd)
    return None


def targets(results: dict[str, Any], open_vs_n: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    """The project's target ratios, computed within this run.

    Each is PASS or MISS; ``n/a`` where a method it compares was not run; ``FAILED``
    (``SKIPPED``) where a figure it needs comes from a round that failed (was skipped),
    with ``"reason"`` naming the method, the round and what happened.
    """
    t: dict[str, Any] = {}

    def add(key: str, text: str, value: float | None, op: str, threshold: float,
            needs: list[tuple[str, str]]) -> None:
        reasons = []
        if value is None:
            for method, key_of in needs:
                rnd = missing(results.get(method), key_of)
                if rnd is not None:
                    rnd["where"] = f"{method}, {round_name(FIGURE_ROUND[key_of])}"
                    reasons.append(rnd)
        if reasons:
            failed = [r for r in reasons if r["status"] != "skipped"]
            status = "FAILED" if failed else "SKIPPED"
        elif value is None:
            status = "n/a"
        else:
            status = verdict(value, op, threshold)
        t[key] = target(text, value, op, threshold, status,
                        [f"{r['where']}: {r['text']}" for r in reasons])

    later = {m: figure(results, m, "later_agent_s") for m in results}
    for other in ("torch_save", "manager_vectors"):
        add(f"later_agent_vs_{other}",
            f"later agent: {other} time / {TSC} time", ratio(later.get(other), later.get(TSC)),
            ">=", 20.0, [(other, "later_agent_s"), (TSC, "later_agent_s")])
    look = {m: figure(results, m, "lookup_items_per_s") for m in results}
    for other, wanted in (("manager_vectors", 50.0), ("hf_datasets", 30.0)):
        add(f"lookup_vs_{other}", f"single lookups/s: {TSC} / {other}",
            ratio(look.get(TSC), look.get(other)), ">=", wanted,
            [(TSC, "lookup_items_per_s"), (other, "lookup_items_per_s")])
    batch = {m: figure(results, m, "batch_items_per_s") for m in results}
    # against the limit itself (a batch of 256 is 3 MiB of copying, no method can beat
    # raw memmap's); the former ">= 20x hf_datasets" was above what raw memmap reaches
    add("batch_vs_raw_memmap", f"random batch of 256, items/s: {TSC} / raw_memmap",
        ratio(batch.get(TSC), batch.get("raw_memmap")), ">=", 0.95,
        [(TSC, "batch_items_per_s"), ("raw_memmap", "batch_items_per_s")])
    growth = figure(results, TSC, "uss_growth_bytes_4_agents")
    store = figure(results, TSC, "disk_bytes")
    add("memory_4_agents", f"4 agents' total private memory growth / {TSC} store size",
        ratio(growth, store), "<=", 0.10,
        [(TSC, "uss_growth_bytes_4_agents"), (TSC, "disk_bytes")])
    first = {m: figure(results, m, "first_agent_s") for m in results}
    add("first_agent_vs_no_cache", f"first agent: no_cache time / {TSC} time (build, 2 workers)",
        ratio(first.get("no_cache"), first.get(TSC)), ">=", 1.7,
        [("no_cache", "first_agent_s"), (TSC, "first_agent_s")])
    add("first_agent_vs_hf_datasets",
        f"first agent: {TSC} time / hf_datasets time (both build with 2 workers)",
        ratio(first.get(TSC), first.get("hf_datasets")), "<=", 0.9,
        [(TSC, "first_agent_s"), ("hf_datasets", "first_agent_s")])
    opens = open_vs_n.get(TSC, {})
    lo, hi = (str(min(sizes)), str(max(sizes))) if sizes else ("", "")
    small = opens.get(lo, {}).get("open_s")
    large = opens.get(hi, {}).get("open_s")
    add("open_largest_vs_smallest", f"{TSC} open time at {hi} items / at {lo} items",
        ratio(large, small), "<=", 2.0, [])
    bad = [(n, opens[n]) for n in (lo, hi) if opens.get(n, {}).get("status", "ok") != "ok"]
    if bad and t["open_largest_vs_smallest"]["value"] is None:
        t["open_largest_vs_smallest"]["status"] = "FAILED"
        t["open_largest_vs_smallest"]["reason"] = "; ".join(
            f"{TSC}, open at {n} items: {r['text']}" for n, r in bad)
    return t


#: the main table's figure columns: record key, format
TABLE: list[tuple[str, Callable[[Any], str]]] = [
    ("first_agent_s", seconds), ("later_agent_s", seconds), ("open_s", seconds),
    ("lookup_items_per_s", rate), ("batch_items_per_s", rate),
    ("dataloader_epoch_s", seconds), ("full_pass_s", seconds),
    ("uss_total_bytes_4_agents", mib), ("pss_total_bytes_4_agents", mib),
    ("uss_growth_bytes_4_agents", mib), ("disk_bytes", mib),
]


def _cell(rec: dict[str, Any], key: str, fmt: Callable[[Any], str]) -> str:
    """A figure, or what happened to the round that should have measured it."""
    value = rec.get(key)
    if value is None:
        rnd = missing(rec, key)
        if rnd is not None:
            return str(rnd["text"])
    return fmt(value)


def _round_cell(rec: dict[str, Any], k: str, key: str) -> str:
    value = rec.get("memory", {}).get(k, {}).get(key)
    rnd = rec.get("rounds", {}).get(k)
    if value is None and rnd and rnd.get("status", "ok") != "ok":
        return str(rnd["text"])
    return mib(value)


def _size_cell(per: dict[str, Any] | None, key: str) -> str:
    if per and per.get("status", "ok") != "ok":
        return str(per["text"])
    return seconds((per or {}).get(key))


def failures(results: dict[str, Any], open_vs_n: dict[str, Any]) -> list[str]:
    """The section listing every round that failed or was skipped, with its evidence."""
    rows = []
    for name, rec in results.items():
        for key, rnd in rec.get("rounds", {}).items():
            if rnd.get("status", "ok") != "ok":
                rows.append((name, round_name(key), rnd))
    for name, per in open_vs_n.items():
        for n, rnd in per.items():
            if rnd.get("status", "ok") != "ok":
                rows.append((name, f"open at {int(n):,} items", rnd))
    if not rows:
        return []
    out = ["", "## Failures and skipped rounds (results, not crashes)", "",
           "| method | round | status | signal | last USS MiB | last anonymous MiB "
           "| elapsed s | what happened |",
           "|---|---|---|---|---:|---:|---:|---|"]
    for name, where, rnd in rows:
        last = rnd.get("last_memory") or {}
        detail = [rnd.get("text", "")]
        if rnd.get("agents"):
            detail.append(f"{rnd.get('role', 'agent')} {rnd.get('agent', 0) + 1} of "
                          f"{rnd['agents']}, waiting for {rnd.get('waiting_for')}")
        detail += list(rnd.get("evidence", []))
        if rnd.get("kernel_log") and rnd["kernel_log"] != "read":
            detail.append(f"kernel log: {rnd['kernel_log']}")
        elapsed = rnd.get("elapsed_s")
        out.append(f"| {name} | {where} | {rnd['status']} | {rnd.get('signal') or '-'} "
                   f"| {mib(last.get('uss'))} | {mib(last.get('anon'))} "
                   f"| {'-' if elapsed is None else f'{elapsed:.1f}'} "
                   f"| {'; '.join(d.replace('|', '/') for d in detail if d)} |")
    return out


def _commands(env: dict[str, Any], results: dict[str, Any]) -> str:
    """``Command: `...` `` or, for a resumed run, each command and what it measured."""
    runs = env.get("runs") or []
    if len(runs) < 2:
        return f"Command: `{env.get('command', 'python -m benchmarks.run')}`"
    parts = []
    for i, run in enumerate(runs):
        until = runs[i + 1]["date"] if i + 1 < len(runs) else None
        measured = [m for m, r in results.items()
                    if run["date"] <= r.get("measured", {}).get("date", "")
                    and (until is None or r["measured"]["date"] < until)]
        parts.append(f"`{run['command']}` ({run.get('wall_s', 0):.0f} s: "
                     f"{', '.join(measured) or 'nothing'})")
    return "Commands, one configuration resumed: " + "; then ".join(parts)


def markdown(report: dict[str, Any],
             sections: Callable[[dict[str, Any]], list[str]] | None = None) -> str:
    """The main benchmark's table, targets and sections (``sections``: more of them, shown
    after the targets, made from the report)."""
    env, results = report["env"], report["methods"]
    sizes = env["sizes"]
    v = env["versions"]
    lines = [
        "# Benchmark: getting cached image vectors into many agent processes",
        "",
        f"{sizes['unique_paths']:,} unique covers ({sizes['ratings_rows']:,} ratings rows), "
        f"3x32x32 float32 = {sizes['column_bytes'] / 2**20:,.1f} MiB per full column. "
        f"{machine(env)}, numpy {v.get('numpy')}, torch {v.get('torch')}, "
        f"zarr {v.get('zarr')}, datasets {v.get('datasets')}; {env['date']}. "
        f"{_commands(env, results)} {wall_and_load(env)}.",
        "",
        "| method | first agent s | later agent s | open s | lookups/s | batch-256 items/s "
        "| DataLoader epoch s | full pass s | USS 4 agents MiB | PSS 4 agents MiB "
        "| USS growth 4 agents MiB | disk MiB | = no_cache |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for name, r in results.items():
        cells = [_cell(r, key, fmt) for key, fmt in TABLE]
        cells.append(same(r.get("vectors_equal_no_cache")))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += target_table(report["targets"], lambda t: t.get("reason") or times(t["value"]))
    if sections is not None:
        lines += sections(report)
    ovn = report.get("open_vs_n") or {}
    if ovn:
        ns = sorted({int(n) for per in ovn.values() for n in per})
        lines += ["", "## Open / load time of a later agent vs store size (random vectors)", "",
                  "| method | " + " | ".join(f"open s @ {n:,}" for n in ns)
                  + " | " + " | ".join(f"hold column s @ {n:,}" for n in ns) + " |",
                  "|---|" + "---:|" * (2 * len(ns))]
        for name, per in ovn.items():
            opens = [_size_cell(per.get(str(n)), "open_s") for n in ns]
            loads = [_size_cell(per.get(str(n)), "load_s") for n in ns]
            lines.append(f"| {name} | " + " | ".join(opens + loads) + " |")
    mem_ks = sorted({int(k) for k in sizes.get("agents") or []}
                    | {int(k) for r in results.values() for k in r.get("memory", {})})
    if mem_ks:
        top = str(max(mem_ks))
        lines += ["", "## Memory growth over a baseline agent (MiB, all agents + manager)", "",
                  "| method | " + " | ".join(f"USS K={k}" for k in mem_ks)
                  + f" | PSS K={top} | anonymous K={top} |",
                  "|---|" + "---:|" * (len(mem_ks) + 2)]
        for name, r in results.items():
            cells = [_round_cell(r, str(k), "uss_growth_bytes") for k in mem_ks]
            cells.append(_round_cell(r, top, "pss_growth_bytes"))
            cells.append(_round_cell(r, top, "anon_growth_bytes"))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += failures(results, ovn)
    lines += [
        "",
        "Notes:",
        "- first agent: time until a fresh agent process holds the vector of every unique "
        "path, computing and caching them (tensorstore_cache and zarr_api build with 2 worker "
        "processes; hf_datasets maps with num_proc=2; the others decode in the agent). Later "
        "agent: the same with the cache in place. Library imports are not timed. Where the "
        "run measured first agents in interleaved rounds (the section above), a method's "
        "first agent is the median of its rounds, and the targets compare medians.",
        "- lookups: one vector by path (no_cache decodes the image; manager methods make one "
        "round trip to the manager; torch_save reads its in-process dict). Batches: 256 random "
        "rows gathered into one array.",
        "- memory: USS/PSS of K agents holding the column at once, after each read every "
        "vector once; growth is over a baseline agent with the same imports; the manager "
        "process is counted in full for the manager methods. USS counts file pages mapped by "
        "one process only, so a single agent reading a memory-mapped store has the store's "
        "pages in its USS; from two agents on they are shared. 'anonymous' counts only "
        "anonymous memory (heap, private copies).",
        f"- {UNSAFE_NOTE}.",
        "- failures: every agent sets its oom_score_adj to 1000, so a round that needs more "
        "memory than the machine has loses an agent to the kernel's OOM killer, never the "
        "driver or another process. A round whose agent is killed, raises or runs past the "
        "agent timeout is recorded as a result: the figures it should have measured say what "
        "happened, at the agent's last sampled anonymous memory (or the anon-rss the kernel "
        "logged), in GB = 10^9 bytes; targets that need such a figure say FAILED (SKIPPED for "
        "a skipped round). A round of K agents whose estimate (K x the 1-agent round's peak "
        "anonymous memory, plus a baseline agent) exceeds the available memory is skipped "
        "unless --allow-oom.",
        "- Timings come from one run on a shared machine; ratios within the run are what the "
        "targets compare.",
    ]
    disk = env.get("disk") or {}
    if disk.get("short"):
        lines.append(f"- disk: {disk['free_bytes'] / 1e9:.1f} GB were free under {disk['path']} "
                     f"at the start, short of the about {disk['need_bytes'] / 1e9:.1f} GB "
                     "this run may write.")
    lines.append("")
    return "\n".join(lines)
