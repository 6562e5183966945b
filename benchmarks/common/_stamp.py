"""The stamp of a run: the code it measured, its command, the machine and the date.

Every results file records, under ``stamp``, the run that wrote it::

    {"commit": "54c06a4...", "dirty": false, "command": "python -m benchmarks.micro",
     "machine": "AMD EPYC 7B13, 2 cores, 24 GiB RAM, Python 3.11.7",
     "date": "2026-12-02T06:42:10+00:00"}

``commit`` is the checkout's ``HEAD`` and ``dirty`` whether its tracked or new files
differed from it (the committed results under ``benchmarks/results/`` aside, which a
resumed run has rewritten); both are None outside a git checkout. A resumed run keeps the
first run's stamp, and every method record under ``methods`` carries the stamp of the run
that measured it, so a file whose methods were measured at different commits says so
(:func:`footer`).
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The checkout the benchmarks run from.
CHECKOUT = Path(__file__).resolve().parents[2]
#: What a rerun rewrites: not a change of the code measured.
RESULTS = "benchmarks/results"
FIELDS = ("commit", "dirty", "command", "machine", "date")


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def command(module: str, argv: list[str] | None) -> str:
    """``python -m MODULE ARGS...``: the command that ran, with ``argv`` or this process's."""
    return " ".join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(env: dict[str, Any]) -> str:
    """``CPU, N cores, R GiB RAM, Python V`` of an environment (``_report.environment``)."""
    return (f"{env['cpu']}, {env['cores']} cores, {env['ram_bytes'] / 2**30:.0f} GiB RAM, "
            f"Python {env['python']}")


def _git(*args: str, checkout: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def revision(checkout: Path = CHECKOUT) -> tuple[str | None, bool | None]:
    """``(HEAD's commit, dirty)`` of ``checkout``; ``(None, None)`` if it is no git checkout."""
    top = _git("rev-parse", "--show-toplevel", checkout=checkout)
    if top is None or Path(top.strip()).resolve() != checkout.resolve():
        return None, None
    head = _git("rev-parse", "HEAD", checkout=checkout)
    status = _git("status", "--porcelain", "--", ".", f":(exclude){RESULTS}", checkout=checkout)
    if head is None or status is None:
        return None, None
    return head.strip(), bool(status.strip())


def run_stamp(module: str, argv: list[str] | None, env: dict[str, Any],
              checkout: Path = CHECKOUT) -> dict[str, Any]:
    """The stamp of this run of ``python -m MODULE`` (``argv`` or this process's), on the
    machine ``env`` describes."""
    commit, dirty = revision(checkout)
    return {"commit": commit, "dirty": dirty, "command": command(module, argv),
            "machine": machine(env), "date": env.get("date") or now()}


def stamp(report: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """Stamp ``report`` with ``run`` (in place, and return it).

    The report keeps the stamp of the run that began it (a resumed run's is another);
    every method record under ``methods`` that has no stamp yet was measured by ``run``
    and gets its stamp.
    """
    report.setdefault("stamp", run)
    for record in (report.get("methods") or {}).values():
        if isinstance(record, dict):
            record.setdefault("stamp", run)
    return report


def unstamped(report: dict[str, Any]) -> list[str]:
    """What in ``report`` lacks a complete stamp: ``stamp``, ``methods.NAME``; empty if none."""
    def incomplete(value: Any) -> bool:
        return not isinstance(value, dict) or any(k not in value for k in FIELDS)

    missing = ["stamp"] if incomplete(report.get("stamp")) else []
    missing += [f"methods.{name}" for name, record in (report.get("methods") or {}).items()
                if isinstance(record, dict) and incomplete(record.get("stamp"))]
    return missing


def _code(s: dict[str, Any]) -> str:
    if s.get("commit") is None:
        return "no git checkout"
    return f"commit {str(s['commit'])[:12]}{' with uncommitted changes' if s['dirty'] else ''}"


def footer(report: dict[str, Any]) -> str:
    """The markdown lines that say what ran: commit, command, machine, date; each method's
    commit where they differ (a resumed run's)."""
    s = report["stamp"]
    lines = ["", f"Measured at {_code(s)}: `{s['command']}`; {s['machine']}; {s['date']}."]
    methods = {name: r["stamp"] for name, r in (report.get("methods") or {}).items()
               if isinstance(r, dict) and "stamp" in r}
    if len({(m["commit"], m["dirty"]) for m in methods.values()}) > 1:
        lines.append("Methods measured at different code: " + "; ".join(
            f"{name} at {_code(m)} ({m['date']})" for name, m in methods.items()) + ".")
    return "\n".join(lines) + "\n"
