"""The PNG plots of a benchmark report: time to vectors, memory vs agents, open time vs N.

A method's round that failed or was skipped has no point or bar; the plots say why
(bar labels, legend entries) with the text the table shows.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common._report import missing


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def plots(report: dict[str, Any], out: Path, prefix: str = "") -> list[Path]:
    """Write the three PNG plots into ``out`` (file names after ``prefix``); return their
    paths. Each file is replaced whole (written aside, then renamed)."""
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
    for y, name in zip(ys, names, strict=True):  # a bar that is missing says why
        for dy, key in ((0.2, "first_agent_s"), (-0.2, "later_agent_s")):
            rnd = missing(results[name], key)
            if rnd is not None and results[name].get(key) is None:
                ax.text(0.01, y - dy, rnd["text"], transform=ax.get_yaxis_transform(),
                        va="center", fontsize=7, color="firebrick")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds until the agent holds every vector (log)")
    n = report["env"]["sizes"]["unique_paths"]
    ax.set_title(f"Time to vectors, {n:,} covers")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    written.append(_save(fig, out / f"{prefix}time_to_vectors.png"))

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for name in names:
        mem = results[name].get("memory", {})
        ks = sorted(int(k) for k in mem)
        if not ks:
            continue
        growth = [max(1.0, (mem[str(k)].get("uss_growth_bytes") or 0) / 2**20) for k in ks]
        pss = [mem[str(k)]["pss_total_bytes"] / 2**20 for k in ks]
        bad = [f"K={k}: {r['text']}" for k, r in results[name].get("rounds", {}).items()
               if k.isdigit() and r.get("status", "ok") != "ok"]
        label = name + (f" ({'; '.join(bad)})" if bad else "")
        axes[0].plot(ks, growth, marker="o", label=label)
        axes[1].plot(ks, pss, marker="o", label=label)
    axes[0].set_title("private memory (USS) growth over baseline, total")
    axes[1].set_title("PSS, total of agents (+ manager)")
    for a in axes:
        a.set_xlabel("agents holding the full column")
        a.set_ylabel("MiB (log)")
        a.set_yscale("log")
        a.set_xticks(sorted({int(k) for k in report["env"]["sizes"].get("agents") or [1, 2, 4]}))
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    written.append(_save(fig, out / f"{prefix}memory_vs_agents.png"))

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
    written.append(_save(fig, out / f"{prefix}open_vs_n.png"))
    return written
