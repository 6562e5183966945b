"""The results of a benchmark that prints its tables as it measures: kept, stamped, written.

A program that prints its tables line by line (the scale, remote, torch batching and
``datasets`` feature-type benchmarks, the cold builds and first reads) keeps them in a
:class:`Record` as it prints them, with its figures, and saves both at the end into
``benchmarks/results/<benchmark>/<name>.json`` and ``.md``, stamped with the run
(:mod:`benchmarks.common._stamp`) and written with portable paths, as every results file
is (:meth:`benchmarks.common._results.ResultsFile.save`)::

    record = Record("benchmarks.scale", argv, results=args.results, name=args.out)
    record.print("| figure | value |")
    record.figures["loader_items_per_s"] = 2345.0
    record.save(workdir=work)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks.common._portable import portable
from benchmarks.common._report import environment, publish
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp

__all__ = ["RESULTS", "Record", "add_results_options"]

#: where the committed results of every benchmark live, one folder per benchmark
RESULTS = Path(__file__).resolve().parents[1] / "results"


def add_results_options(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """``--results DIR`` (default ``benchmarks/results/<benchmark>``) and ``--out NAME``
    (default ``<benchmark>``): where a run's results go."""
    parser.add_argument("--results", type=Path, default=RESULTS / benchmark,
                        help=f"results directory (default benchmarks/results/{benchmark})")
    parser.add_argument("--out", default=benchmark,
                        help=f"results name: NAME.json and NAME.md (default {benchmark})")


class Record:
    """What a run printed and measured, to be saved stamped.

    Parameters
    ----------
    module
        The program's module, as ``python -m`` runs it (``benchmarks.scale``).
    argv
        Its arguments (None: this process's).
    results
        The results directory.
    name
        The results name (``NAME.json``, ``NAME.md``).
    """

    def __init__(self, module: str, argv: list[str] | None, *, results: Path, name: str) -> None:
        self.env = environment()
        self.run = run_stamp(module, argv, self.env)
        self.files = ResultsFile(results, name)
        self.figures: dict[str, Any] = {}
        self.config: dict[str, Any] = {}
        self.lines: list[str] = []

    def print(self, line: str = "") -> None:
        """Print ``line`` (flushed) and keep it for the table."""
        print(line, flush=True)
        self.lines.append(line)

    def save(self, **places: str | os.PathLike[str] | None) -> str:
        """Write the figures and the kept lines, stamped, with the run's directories by name
        (``workdir=...``; the results directory as ``<results>``) written as placeholders;
        the table as written."""
        places = {"results": self.files.directory, **places}
        report = {"env": self.env, "config": self.config, "figures": self.figures}
        load = ", ".join(f"{x:.1f}" for x in self.env.get("loadavg_at_start") or [])
        lines = portable([f"Load average at the start: {load}.", "", *self.lines], **places)
        return publish(self.files, report, lambda _r: "\n".join(lines) + "\n", self.run,
                       **places)
