"""Paths in a report as anyone can read and rerun them: no directory of the machine that ran it.

The committed reports are read, and their commands rerun, on other machines.
:func:`portable` writes every absolute path in a report (commands, work
directories, log files, tracebacks) as:

- ``<data>/...``, ``<workdir>/...``, ``<results>/...`` (the directories a run
  was given, by name), unless they lie in the checkout;
- relative to the checkout (``benchmarks/results``, ``.venv/lib/...``);
- ``<python>/...`` under the interpreter's prefixes, ``~/...`` under the home
  directory, ``<tmp>/...`` under the temporary directory.

The most specific directory wins (the data directory inside the work
directory is ``<data>``). Run ``python -m benchmarks.common._portable FILE.json...``
to rewrite reports written before (each with its ``.md``), from the
directories their configuration records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CHECKOUT", "portable", "rewrite_report"]

#: The checkout the benchmarks run from.
CHECKOUT = Path(__file__).resolve().parents[2]

_PATH_CHARS = r"\w.+-"


def _forms(path: str | os.PathLike[str]) -> set[str]:
    """``path`` as given, absolute, and with symlinks resolved."""
    raw = os.fspath(path)
    out = {raw.rstrip("/") or "/", os.path.abspath(raw), os.path.realpath(raw)}
    return {p for p in out if p.startswith("/") and p != "/"}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _rules(places: Mapping[str, str | os.PathLike[str] | None], checkout: Path
           ) -> list[tuple[str, str]]:
    """``(absolute prefix, replacement)`` pairs, longest prefix first."""
    roots = _forms(checkout)
    rules: dict[str, str] = {}
    for name, place in places.items():
        if place is None:
            continue
        for form in _forms(place):
            if not any(_inside(form, r) for r in roots):  # in the checkout: relative
                rules.setdefault(form, f"<{name}>")
    for form in roots:
        rules[form] = "."
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for form in _forms(prefix):
            if not any(_inside(form, r) for r in roots):
                rules.setdefault(form, "<python>")
    for form in _forms(Path.home()):
        rules.setdefault(form, "~")
    for form in _forms(tempfile.gettempdir()):
        rules.setdefault(form, "<tmp>")
    return sorted(rules.items(), key=lambda kv: -len(kv[0]))


def _substitute(rules: list[tuple[str, str]]) -> Callable[[str], str]:
    if not rules:
        return lambda text: text
    by_prefix = dict(rules)
    alternatives = "|".join(re.escape(prefix) for prefix, _ in rules)  # longest first
    pattern = re.compile(rf"(?<![{_PATH_CHARS}/<>~])({alternatives})(/|(?![{_PATH_CHARS}/]))")

    def one(match: re.Match[str]) -> str:
        new, slash = by_prefix[match.group(1)], match.group(2)
        if new == "." and slash:  # in the checkout: relative, without "./"
            return ""
        return new + slash

    return lambda text: pattern.sub(one, text)


def portable(value: Any, *, checkout: Path = CHECKOUT,
             **places: str | os.PathLike[str] | None) -> Any:
    """Return a copy of ``value`` (a report: dicts, lists, strings...) with portable paths.

    Parameters
    ----------
    value
        What to write: every string in it, keys included, is rewritten.
    checkout
        Paths under it are written relative to it.
    places
        The run's directories by name (``data=...``, ``workdir=...``); a path
        under one becomes ``<name>/...``.

    Examples
    --------
    >>> portable({"command": "python -m benchmarks.run --data /data/covers "
    ...                      "--results /src/tsc/benchmarks/results"},
    ...          checkout=Path("/src/tsc"), data="/data/covers")
    {'command': 'python -m benchmarks.run --data <data> --results benchmarks/results'}
    """
    sub = _substitute(_rules(places, checkout))

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return sub(item)
        if isinstance(item, dict):
            return {walk(k): walk(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        return item

    return walk(value)


def _checkout_of(results: str | None) -> Path | None:
    """The checkout whose ``benchmarks/results`` (or a benchmark's folder in it) is ``results``."""
    if not results or not results.startswith("/"):
        return None
    for folder in (Path(results), Path(results).parent):  # results/ or results/<benchmark>/
        if folder.parts[-2:] == ("benchmarks", "results"):
            return folder.parent.parent
    return None


def rewrite_report(path: Path) -> None:
    """Rewrite ``NAME.json`` and ``NAME.md`` written with absolute paths, in place.

    The places come from the report's configuration (``data``, ``workdir``,
    ``results``); the checkout that ran it is the one holding ``results``
    when that is its ``benchmarks/results`` or a benchmark's folder in it
    (``benchmarks/results/<benchmark>``), else this checkout.

    Parameters
    ----------
    path
        The report's ``.json``; the ``.md`` beside it, if any, is rewritten too.
    """
    from benchmarks.common._results import write_atomic

    text = path.read_text(encoding="utf-8")
    report = json.loads(text)
    config = report.get("config", {})
    places = {k: config.get(k) for k in ("data", "workdir", "results")}
    checkout = _checkout_of(config.get("results")) or CHECKOUT
    convert = _substitute(_rules(places, checkout))
    write_atomic(path, convert(text))
    md = path.with_suffix(".md")
    if md.exists():
        write_atomic(md, convert(md.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    """Rewrite each report named on the command line.

    Parameters
    ----------
    argv
        The arguments (``sys.argv[1:]`` when None): ``--help``, or the reports' ``.json`` files.

    Returns
    -------
    int
        The exit status: 0 once every report is rewritten.
    """
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.common._portable",
        description="Rewrite benchmark reports written with absolute paths, in place: each "
        "NAME.json and the NAME.md beside it, from the directories its configuration records.",
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="NAME.json",
                        help="a report's JSON file")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)} (give the .json files of reports)")
    for report in args.reports:
        rewrite_report(report)
        print(f"rewrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
