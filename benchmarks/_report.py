"""Environment, target ratios, the markdown table and the plots of a benchmark run."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.methods.torch_save import UNSAFE_NOTE

TSC = "tensorstore_cache"
PACKAGES = ("numpy", "torch", "zarr", "datasets", "pandas", "pyarrow", "pillow", "tensorstore",
            "psutil", "xxhash")


def environment() -> dict[str, Any]:
    """CPU, cores, RAM, Python and library versions of this machine."""
    import psutil

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": versions,
    }


def _get(results: dict[str, Any], method: str, key: str) -> float | None:
    value = results.get(method, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def targets(results: dict[str, Any], open_vs_n: dict[str, Any], sizes: list[int]) -> dict[str, Any]:
    """The project's target ratios, computed within this run, each PASS or MISS."""
    t: dict[str, Any] = {}

    def add(key: str, text: str, value: float | None, op: str, threshold: float) -> None:
        if value is None:
            status = "n/a"
        elif op == ">=":
            status = "PASS" if value >= threshold else "MISS"
        elif op == ">":
            status = "PASS" if value > threshold else "MISS"
        else:
            status = "PASS" if value <= threshold else "MISS"
        t[key] = {"description": text, "value": value, "op": op, "threshold": threshold,
                  "status": status}

    later = {m: _get(results, m, "later_agent_s") for m in results}
    for other in ("torch_save", "manager_vectors"):
        add(f"later_agent_vs_{other}",
            f"later agent: {other} time / {TSC} time", _ratio(later.get(other), later.get(TSC)),
            ">=", 20.0)
    look = {m: _get(results, m, "lookup_items_per_s") for m in results}
    add("lookup_vs_manager_vectors", f"single lookups/s: {TSC} / manager_vectors",
        _ratio(look.get(TSC), look.get("manager_vectors")), ">=", 50.0)
    add("lookup_vs_hf_datasets", f"single lookups/s: {TSC} / hf_datasets",
        _ratio(look.get(TSC), look.get("hf_datasets")), ">=", 30.0)
    batch = {m: _get(results, m, "batch_items_per_s") for m in results}
    add("batch_vs_raw_memmap", f"random batch of 256, items/s: {TSC} / raw_memmap",
        _ratio(batch.get(TSC), batch.get("raw_memmap")), ">=", 0.5)
    add("batch_vs_hf_datasets", f"random batch of 256, items/s: {TSC} / hf_datasets",
        _ratio(batch.get(TSC), batch.get("hf_datasets")), ">=", 20.0)
    growth = _get(results, TSC, "uss_growth_bytes_4_agents")
    store = _get(results, TSC, "disk_bytes")
    add("memory_4_agents", f"4 agents' total private memory growth / {TSC} store size",
        _ratio(growth, store), "<=", 0.10)
    first = {m: _get(results, m, "first_agent_s") for m in results}
    add("first_agent_vs_no_cache", f"first agent: no_cache time / {TSC} time (build, 2 workers)",
        _ratio(first.get("no_cache"), first.get(TSC)), ">", 1.0)
    opens = open_vs_n.get(TSC, {})
    lo, hi = (str(min(sizes)), str(max(sizes))) if sizes else ("", "")
    small = opens.get(lo, {}).get("open_s")
    large = opens.get(hi, {}).get("open_s")
    add("open_largest_vs_smallest", f"{TSC} open time at {hi} items / at {lo} items",
        _ratio(large, small), "<=", 2.0)
    return t


def _s(value: Any) -> str:
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


def _rate(value: Any) -> str:
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


def _mb(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value) / 2**20:,.1f}"


def _x(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    return f"{v:.3g}x" if v < 1000 else f"{v:,.0f}x"


def markdown(report: dict[str, Any]) -> str:
    env, results = report["env"], report["methods"]
    sizes = env["sizes"]
    v = env["versions"]
    lines = [
        "# Benchmark: getting cached image vectors into many agent processes",
        "",
        f"{sizes['unique_paths']:,} unique covers ({sizes['ratings_rows']:,} ratings rows), "
        f"3x32x32 float32 = {sizes['column_bytes'] / 2**20:,.1f} MiB per full column. "
        f"{env['cpu']}, {env['cores']} cores, {env['ram_bytes'] / 2**30:.0f} GiB RAM, "
        f"Python {env['python']}, numpy {v.get('numpy')}, torch {v.get('torch')}, "
        f"zarr {v.get('zarr')}, datasets {v.get('datasets')}; {env['date']}. "
        f"Command: `{env.get('command', 'python -m benchmarks.run')}` "
        f"({env.get('wall_s', 0):.0f} s, load average at start "
        f"{', '.join(f'{x:.1f}' for x in env.get('loadavg_at_start') or [])}).",
        "",
        "| method | first agent s | later agent s | open s | lookups/s | batch-256 items/s "
        "| DataLoader epoch s | full pass s | USS 4 agents MiB | PSS 4 agents MiB "
        "| USS growth 4 agents MiB | disk MiB | = no_cache |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for name, r in results.items():
        same = r.get("vectors_equal_no_cache")
        lines.append(
            f"| {name} | {_s(r.get('first_agent_s'))} | {_s(r.get('later_agent_s'))} "
            f"| {_s(r.get('open_s'))} | {_rate(r.get('lookup_items_per_s'))} "
            f"| {_rate(r.get('batch_items_per_s'))} | {_s(r.get('dataloader_epoch_s'))} "
            f"| {_s(r.get('full_pass_s'))} | {_mb(r.get('uss_total_bytes_4_agents'))} "
            f"| {_mb(r.get('pss_total_bytes_4_agents'))} "
            f"| {_mb(r.get('uss_growth_bytes_4_agents'))} | {_mb(r.get('disk_bytes'))} "
            f"| {'yes' if same else ('-' if same is None else 'NO')} |"
        )
    lines += ["", "## Targets (ratios within this run)", "",
              "| target | value | wanted | status |", "|---|---:|---:|:---:|"]
    for t in report["targets"].values():
        lines.append(f"| {t['description']} | {_x(t['value'])} | {t['op']} {t['threshold']:g}x "
                     f"| {t['status']} |")
    ovn = report.get("open_vs_n") or {}
    if ovn:
        ns = sorted({int(n) for per in ovn.values() for n in per})
        lines += ["", "## Open / load time of a later agent vs store size (random vectors)", "",
                  "| method | " + " | ".join(f"open s @ {n:,}" for n in ns)
                  + " | " + " | ".join(f"hold column s @ {n:,}" for n in ns) + " |",
                  "|---|" + "---:|" * (2 * len(ns))]
        for name, per in ovn.items():
            opens = [_s(per.get(str(n), {}).get("open_s")) for n in ns]
            loads = [_s(per.get(str(n), {}).get("load_s")) for n in ns]
            lines.append(f"| {name} | " + " | ".join(opens + loads) + " |")
    mem_ks = sorted({int(k) for r in results.values() for k in r.get("memory", {})})
    if mem_ks:
        top = str(max(mem_ks))
        lines += ["", "## Memory growth over a baseline agent (MiB, all agents + manager)", "",
                  "| method | " + " | ".join(f"USS K={k}" for k in mem_ks)
                  + f" | PSS K={top} | anonymous K={top} |",
                  "|---|" + "---:|" * (len(mem_ks) + 2)]
        for name, r in results.items():
            mem = r.get("memory", {})
            cells = [_mb(mem.get(str(k), {}).get("uss_growth_bytes")) for k in mem_ks]
            cells.append(_mb(mem.get(top, {}).get("pss_growth_bytes")))
            cells.append(_mb(mem.get(top, {}).get("anon_growth_bytes")))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Notes:",
        "- first agent: time until a fresh agent process holds the vector of every unique "
        "path, computing and caching them (tensorstore_cache and zarr_api build with 2 worker "
        "processes; hf_datasets maps with num_proc=2; the others decode in the agent). Later "
        "agent: the same with the cache in place. Library imports are not timed.",
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
        "- Timings come from one run on a shared machine; ratios within the run are what the "
        "targets compare.",
        "",
    ]
    return "\n".join(lines)


def plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Write the three PNG plots into ``out``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["methods"]
    names = list(results)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 5))
    ys = range(len(names))
    first = [results[m].get("first_agent_s") or 0 for m in names]
    later = [results[m].get("later_agent_s") or 0 for m in names]
    ax.barh([y + 0.2 for y in ys], first, height=0.4, label="first agent (builds the cache)")
    ax.barh([y - 0.2 for y in ys], later, height=0.4, label="later agent (cache in place)")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds until the agent holds every vector (log)")
    n = report["env"]["sizes"]["unique_paths"]
    ax.set_title(f"Time to vectors, {n:,} covers")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    written.append(out / "time_to_vectors.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in names:
        mem = results[name].get("memory", {})
        ks = sorted(int(k) for k in mem)
        if not ks:
            continue
        growth = [max(1.0, (mem[str(k)].get("uss_growth_bytes") or 0) / 2**20) for k in ks]
        pss = [mem[str(k)]["pss_total_bytes"] / 2**20 for k in ks]
        axes[0].plot(ks, growth, marker="o", label=name)
        axes[1].plot(ks, pss, marker="o", label=name)
    axes[0].set_title("private memory (USS) growth over baseline, total")
    axes[1].set_title("PSS, total of agents (+ manager)")
    for a in axes:
        a.set_xlabel("agents holding the full column")
        a.set_ylabel("MiB (log)")
        a.set_yscale("log")
        a.set_xticks([1, 2, 4])
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    written.append(out / "memory_vs_agents.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, per in (report.get("open_vs_n") or {}).items():
        ns = sorted(int(k) for k in per)
        vals = [per[str(k)].get("open_s") for k in ns]
        pts = [(k, v) for k, v in zip(ns, vals, strict=True) if v]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("items in the store (log)")
    ax.set_ylabel("open / load seconds in a fresh agent (log)")
    ax.set_title("Open / load time vs store size")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    written.append(out / "open_vs_n.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
