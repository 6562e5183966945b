"""Figures, targets, the markdown table and the timeline plot of a sweep run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.common._results import ResultsFile

TSC = "tensorstore_cache"
#: the same with ``identity="none"``: no ``stat`` of the sources
TSC_NONE = "tensorstore_cache_none"
MiB = 2**20


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(res: dict[str, Any], agents: int) -> dict[str, Any]:
    """One method's figures in one run, from its trials' records.

    *Later* trials are those started once the cache existed: at or after the moment the
    method's first trial held every vector (for methods without a cache: once a trial had
    them). The *first round* is the first ``agents`` trials, started together on an empty
    cache.
    """
    trials = res["trials"]
    ok = [t for t in trials if t["status"] == "ok"]
    ready = min((t["at_vectors"] for t in trials if "at_vectors" in t), default=None)
    later = [t for t in ok if ready is not None and t["at_spawn"] >= ready]
    first = [t for t in trials if t["number"] < agents]
    written = [t["write_bytes"] for t in trials if "write_bytes" in t]

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        return _median([r[key] for r in rows if isinstance(r.get(key), (int, float))])

    return {
        "wall_s": res["wall_s"],
        "trials": len(trials),
        "ok": len(ok),
        "failures": [{"number": t["number"], "outcome": t["outcome"]} for t in trials
                     if t["status"] != "ok"],
        "cache_ready_s": ready,
        "later_trials": len(later),
        "later_data_s": med(later, "data_s"),
        "later_ttfb_s": med(later, "ttfb_s"),
        "later_data_share": med(later, "data_share"),
        "later_table_read_s": med(later, "table_read_s"),
        "later_vectors_s": med(later, "vectors_s"),
        "later_dataset_s": med(later, "dataset_s"),
        "first_round_data_s": med([t for t in first if t["status"] == "ok"], "data_s"),
        "first_round_decode_cpu_s": sum(t["decode_cpu_s"] for t in first),
        "first_round_decode_calls": sum(t["decode_calls"] for t in first),
        "decode_cpu_s": sum(t["decode_cpu_s"] for t in trials),
        "decode_calls": sum(t["decode_calls"] for t in trials),
        "startup_s": med(trials, "startup_s"),
        "interpreter_s": med(trials, "interpreter_s"),
        "import_s": med(trials, "import_s"),
        "train_s": med(ok, "train_s"),
        "peak_node_bytes": res["peak"].get("node"),
        "peak": res["peak"],
        "write_bytes": sum(written) if written else None,
        "write_bytes_trials": len(written),
        "disk_bytes": res.get("disk_bytes"),
        "sampler_cpu_s": res.get("sampler_cpu_s"),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def run_targets(summary: dict[str, dict[str, Any]], agents: int,
                baseline_peak: float | None) -> dict[str, dict[str, Any]]:
    """The issue's targets, as ratios within one run (None with a reason when not measurable)."""
    t = summary.get(TSC)
    out: dict[str, dict[str, Any]] = {}

    def add(key: str, text: str, value: float | None, op: str, threshold: float,
            needs: list[str]) -> None:
        why = []
        for name in needs:
            s = summary.get(name)
            if s is None:
                why.append(f"{name} not run")
            elif s["failures"]:
                why.append(f"{name}: {len(s['failures'])} trial(s) failed "
                           f"({s['failures'][0]['outcome']})")
        out[key] = {"description": text, "value": value, "op": op, "threshold": threshold,
                    "note": "; ".join(why) or None}

    if t is None:
        return out
    for other, threshold in (("torch_save", 20.0), ("no_cache", 50.0)):
        o = summary.get(other)
        add(f"later_data_vs_{other}",
            f"trials started once the cache exists, time getting data: {other} / {TSC}",
            _ratio(o["later_data_s"] if o else None, t["later_data_s"]), ">=", threshold, [other, TSC])
    o = summary.get("torch_save")
    add("first_round_decode_vs_torch_save",
        f"first round of {agents} trials, decode CPU: torch_save / {TSC}",
        _ratio(o["first_round_decode_cpu_s"] if o else None, t["first_round_decode_cpu_s"]), ">=",
        0.75 * agents, ["torch_save", TSC])
    for name, threshold in ((TSC, 0.8), (TSC_NONE, 0.5)):
        mine, hf = summary.get(name), summary.get("hf_datasets")
        add(f"later_data_{name}_vs_hf_datasets",
            f"trials started once the cache exists, time getting data: {name} / hf_datasets",
            _ratio(mine["later_data_s"] if mine else None, hf["later_data_s"] if hf else None),
            "<=", threshold, [name, "hf_datasets"])
    others = [s["wall_s"] for name, s in summary.items() if name not in (TSC, TSC_NONE)]
    add("wall_lowest", f"sweep wall time: fastest other method (but {TSC_NONE}) / {TSC}",
        _ratio(min(others), t["wall_s"]) if others else None, ">", 1.0, [TSC])
    store = t["disk_bytes"]
    peak = t["peak_node_bytes"]
    value = (peak - baseline_peak) / store if peak and store and baseline_peak is not None \
        else None
    add("peak_memory_vs_store",
        f"{TSC} peak node memory minus the agents' own (baseline round), / store size",
        value, "<=", 1.5, [TSC])
    return out


def _holds(value: float, op: str, threshold: float) -> bool:
    return value >= threshold if op == ">=" else value > threshold if op == ">" else \
        value <= threshold


def judge(per_run: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Combine the runs: a target passes if it holds in every run by more than the spread.

    The margin is the distance from the threshold to the value of the worst run; the
    spread is the largest minus the smallest value over the runs. With one run there is
    no spread, and a holding target is marked ``PASS (1 run)``.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, first in per_run[0].items():
        values = [r[key]["value"] for r in per_run if key in r]
        notes = sorted({r[key]["note"] for r in per_run if key in r and r[key]["note"]})
        entry = {k: first[k] for k in ("description", "op", "threshold")}
        entry.update(values=values, note="; ".join(notes) or None)
        op, threshold = first["op"], first["threshold"]
        if any(v is None for v in values):
            entry.update(status="n/a", spread=None, margin=None)
        else:
            worst = min(values) if op in (">=", ">") else max(values)
            spread = max(values) - min(values)
            margin = worst - threshold if op in (">=", ">") else threshold - worst
            if not all(_holds(v, op, threshold) for v in values):
                status = "MISS"
            elif len(values) < 2:
                status = "PASS (1 run)"
            else:
                status = "PASS" if margin > spread else "MISS (within spread)"
            entry.update(status=status, spread=spread if len(values) > 1 else None,
                         margin=margin)
        out[key] = entry
    return out


def rmse_check(runs: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Per configuration, the largest RMSE (and test prediction) difference over methods."""
    by_number: dict[int, list[tuple[str, float, float]]] = {}
    for run in runs:
        for name, res in run["methods"].items():
            for t in res["trials"]:
                if t["status"] == "ok":
                    by_number.setdefault(t["number"], []).append(
                        (name, t["val_rmse"], t["test_pred_mean"]))
    worst = worst_pred = 0.0
    per: dict[str, Any] = {}
    for number, vals in sorted(by_number.items()):
        rmses = [v[1] for v in vals]
        preds = [v[2] for v in vals]
        diff, pdiff = max(rmses) - min(rmses), max(preds) - min(preds)
        worst, worst_pred = max(worst, diff), max(worst_pred, pdiff)
        per[str(number)] = {"rmse": min(rmses), "max_difference": diff,
                            "methods": sorted({v[0] for v in vals})}
    return {"tolerance": tolerance, "max_rmse_difference": worst,
            "max_test_prediction_difference": worst_pred,
            "same": worst <= tolerance and worst_pred <= tolerance, "configs": per}


def build(env: dict[str, Any], config: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The report: per-run summaries, the judged targets and the RMSE check."""
    agents = config["agents"]
    base = runs[0]["baseline"]
    baseline = {"peak_node_bytes": base["peak"].get("node"), "peak": base["peak"],
                "startup_s": _median([t["startup_s"] for t in base["trials"]
                                      if "startup_s" in t])}
    summaries, targets = [], []
    for run in runs:
        s = {name: summarize(res, agents) for name, res in run["methods"].items()}
        summaries.append({"methods": s})
        targets.append(run_targets(s, agents, baseline["peak_node_bytes"]))
    return {"env": env, "config": config, "baseline": baseline, "summary": summaries,
            "targets": judge(targets), "rmse_check": rmse_check(runs, config["tolerance"]),
            "runs": runs}


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MiB:,.0f}"


def _runs(summaries: list[dict[str, Any]], name: str, key: str, fmt: Any) -> str:
    vals = [s["methods"][name].get(key) for s in summaries if name in s["methods"]]
    return " / ".join(fmt(v) for v in vals)


#: what a failed trial's error says when it read a cache file that was not whole
_TORN_READ = ("EOFError", "PytorchStreamReader failed")


def failure_notes(summaries: list[dict[str, Any]]) -> list[str]:
    """The failed trials of every method, in plain words (one paragraph per kind)."""
    notes: list[str] = []
    for name in summaries[0]["methods"]:
        fails = [f for s in summaries for f in s["methods"][name]["failures"]]
        oom = [f["number"] for f in fails if "out of memory" in f["outcome"]]
        torn = [f["number"] for f in fails if any(m in f["outcome"] for m in _TORN_READ)]
        if oom:
            notes.append(
                f"{name}: trial(s) {', '.join(map(str, oom))} were killed by the kernel's "
                "OOM killer: the agents together needed more memory than the machine has.")
        if torn and name == "torch_save":
            notes.append(
                f"torch_save: trial(s) {', '.join(map(str, torn))} failed reading the cache "
                "file while another agent was still writing it (or had left it cut short "
                "when it was killed): `EOFError: Ran out of input` or `PytorchStreamReader "
                "failed reading zip archive`. This is the original method's own defect, not "
                "the benchmark's: an agent that finds the file `torch.load`s it, and the agent that builds it writes it in place with "
                "`torch.save`, with no lock and no write-then-rename, so any agent starting "
                "during a write reads a partial file and dies. tensorstore_cache publishes a "
                "part only once it is complete (atomic rename) and makes concurrent callers "
                "wait on the build lock.")
        elif torn:
            notes.append(f"{name}: trial(s) {', '.join(map(str, torn))} failed reading a "
                         "partial file.")
    return notes


def markdown(report: dict[str, Any]) -> str:
    env, cfg, summaries = report["env"], report["config"], report["summary"]
    sizes = env["sizes"]
    names = list(summaries[0]["methods"])
    nruns = len(summaries)
    lines = [
        f"# Sweep: {cfg['trials']} trials per method, {cfg['agents']} agents, "
        f"{sizes['covers']:,} covers",
        "",
        f"Command: `{env['command']}`; {env['date']}; {env['cpu']}, {env['cores']} cores, "
        f"{env['ram_bytes'] / 2**30:.0f} GiB; Python {env['python']}, torch "
        f"{env['versions'].get('torch')}, datasets {env['versions'].get('datasets')}; "
        f"whole run {env['wall_s'] / 60:.1f} min.",
        "",
        f"{sizes['train_covers']:,} train covers ({sizes['train_rows']:,} ratings rows) and "
        f"{sizes['test_covers']:,} test covers ({sizes['test_rows']:,} rows); "
        f"{sizes['vector_bytes'] / MiB:,.0f} MiB of 3x32x32 float32 vectors. Every trial is a "
        f"fresh `python` process (Optuna `ask`/`tell` by {cfg['agents']} agent lanes), trains "
        f"at most {cfg['steps']} steps; {nruns} run(s), figures given as "
        f"{' / '.join(f'run {i + 1}' for i in range(nruns))}.",
        "",
        "| method | sweep wall s | later trials: first batch after s | of which getting data s "
        "| data share of a later trial | first round: decode CPU s | node peak MiB "
        "| written MiB | cache on disk MiB | trials ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        fails = [f"{f['number']}: {f['outcome']}" for s in summaries
                 for f in s["methods"][name]["failures"]]
        ok = " / ".join(f"{s['methods'][name]['ok']}/{s['methods'][name]['trials']}"
                        for s in summaries)
        lines.append(
            f"| {name} | {_runs(summaries, name, 'wall_s', _num)} "
            f"| {_runs(summaries, name, 'later_ttfb_s', _num)} "
            f"| {_runs(summaries, name, 'later_data_s', lambda v: _num(v, '{:.3f}'))} "
            f"| {_runs(summaries, name, 'later_data_share', lambda v: _num(v, '{:.1%}'))} "
            f"| {_runs(summaries, name, 'first_round_decode_cpu_s', _num)} "
            f"| {_runs(summaries, name, 'peak_node_bytes', _mib)} "
            f"| {_runs(summaries, name, 'write_bytes', _mib)} "
            f"| {_runs(summaries, name, 'disk_bytes', _mib)} | {ok} |"
        )
        for fail in fails:
            lines.append(f"|  | trial {fail} | | | | | | | | |")
    notes = failure_notes(summaries)
    if notes:
        lines += ["", "Failed trials, in plain words:", ""]
        lines += [f"- {note}" for note in notes]
    base = report["baseline"]
    starts = [s["methods"][n]["startup_s"] for s in summaries for n in names
              if s["methods"][n]["startup_s"] is not None]
    sampler = [s["methods"][n]["sampler_cpu_s"] or 0.0 for s in summaries for n in names]
    walls = [s["methods"][n]["wall_s"] for s in summaries for n in names]
    lines += [
        "",
        "Getting data in a later trial (median), from the end of its imports to its first "
        "batch: reading the ratings tables + getting the vectors from the method + building "
        "the datasets and drawing the first batch, in seconds:",
        "",
        "| method | tables | vectors | datasets, first batch | total |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        cell = [_runs(summaries, name, k, lambda v: _num(v, "{:.3f}"))
                for k in ("later_table_read_s", "later_vectors_s", "later_dataset_s",
                          "later_data_s")]
        lines.append(f"| {name} | " + " | ".join(cell) + " |")
    lines += [
        "",
        f"Interpreter start-up and imports, not counted as getting data: median "
        f"{_num(_median(starts))} s per trial. Agents' own memory (a round of "
        f"{cfg['agents']} trials with the same imports, tables and training on synthetic "
        f"batches): {_mib(base['peak_node_bytes'])} MiB. Memory sampling (every "
        f"{cfg['sample_period_s']:g} s) took {sum(sampler):.0f} CPU-s of the driver over "
        f"{sum(walls):.0f} s of sweeps.",
        "",
        "| target | " + " | ".join(f"run {i + 1}" for i in range(nruns))
        + " | wanted | spread | status |",
        "|---|" + "---:|" * nruns + "---:|---:|:---:|",
    ]
    for t in report["targets"].values():
        vals = " | ".join(_num(v, "{:.3g}") for v in t["values"])
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['description']}{note} | {vals} | {t['op']} {t['threshold']:g} "
                     f"| {_num(t['spread'], '{:.3g}')} | {t['status']} |")
    rc = report["rmse_check"]
    lines += [
        "",
        f"Same model, data and seeds: every configuration's validation RMSE agrees across "
        f"methods and runs within {rc['max_rmse_difference']:.2g} (tolerance "
        f"{rc['tolerance']:g}), test predictions within "
        f"{rc['max_test_prediction_difference']:.2g}: "
        + ("**same**." if rc["same"] else "**DIFFERENT**."),
        "",
    ]
    return "\n".join(lines)


def plot_timeline(report: dict[str, Any], path: Path, run: int = 0) -> None:
    """One panel per method, one lane per agent, each trial a bar split into start-up
    (interpreter and imports), getting data, training, and evaluation with the exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    runs = report["runs"][run]["methods"]
    agents = report["config"]["agents"]
    names = list(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.0 + 0.45 * agents * len(names) + 0.6),
                             sharex=True, squeeze=False)
    colours = {"start-up": "#c7c7c7", "getting data": "#e6550d", "training": "#3182bd",
               "evaluation, exit": "#9ecae1"}
    for ax, name in zip(axes[:, 0], names, strict=True):
        for t in runs[name]["trials"]:
            y = t["lane"]
            if t["status"] != "ok":
                ax.barh(y, t["at_exit"] - t["at_spawn"], left=t["at_spawn"], color="#fcbba1",
                        hatch="//", edgecolor="#a50f15", height=0.7)
                ax.text(t["at_spawn"], y, f" {t['number']}: {t['outcome']}", va="center",
                        fontsize=7, color="#a50f15")
                continue
            parts = [("start-up", t["at_spawn"], t["at_imported"]),
                     ("getting data", t["at_imported"], t["at_first_batch"]),
                     ("training", t["at_first_batch"], t["at_trained"]),
                     ("evaluation, exit", t["at_trained"], t["at_exit"])]
            for label, a, b in parts:
                ax.barh(y, b - a, left=a, color=colours[label], height=0.7, edgecolor="white",
                        linewidth=0.3)
            ax.text(t["at_spawn"], y, f" {t['number']}", va="center", fontsize=6)
        wall = runs[name]["wall_s"]
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
        ax.set_yticks(range(agents))
        ax.set_yticklabels([f"agent {i}" for i in range(agents)], fontsize=7)
        ax.set_ylim(agents - 0.5, -0.5)
        ax.axvline(wall, color="black", linewidth=0.8)
        ax.text(wall, -0.5, f" {wall:.0f} s", va="top", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="#fcbba1", hatch="//",
                                 edgecolor="#a50f15"))
    fig.legend(handles, [*colours, "failed"], loc="upper left", bbox_to_anchor=(0.0, 0.975),
               ncol=5, fontsize=8, frameon=False)
    sizes = report["env"]["sizes"]
    fig.suptitle(f"{report['config']['trials']} trials per method, {agents} agents, "
                 f"{sizes['covers']:,} covers: where each trial's time goes (run {run + 1})",
                 fontsize=10, x=0.01, y=0.998, ha="left")
    axes[-1, 0].set_xlabel("seconds since the sweep started")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict[str, Any], files: ResultsFile) -> str:
    """``NAME.json``, ``NAME.md`` (each atomically) and ``NAME_timeline.png``; return the
    table as written."""
    text = files.save(report, markdown(report))
    plot_timeline(report, files.directory / f"{files.name}_timeline.png")
    return text
