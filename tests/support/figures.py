"""Figures quoted in the docs, checked against the committed results they come from.

A markdown table of a page (:func:`tables`) is matched with the results file it quotes by a
:class:`TableSpec`: which row is which record, and what each column shows of it. Every
figure of a cell must be its recorded value rounded once, at the precision shown
(:func:`rounded_once`): ``10.95`` shown from 10.9476 passes, ``11.0`` does not (it was
rounded twice). A cell's unit says how the value was scaled (``ms``, ``us``, ``k``, ``M``,
``GB``, ``MB``, ``%``; a unit in the column's header only, such as MiB, is the extractor's to
apply). A cell may also hold words the results record (``PASS``, ``killed: out of memory at
6.6 GB``), checked as text, and ``-`` where nothing was measured.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Expected", "TableSpec", "check_cell", "check_table", "clean", "load", "numbers",
           "rounded_once", "tables"]

REPO = Path(__file__).resolve().parents[2]

#: a figure as a cell shows it: digits (thousands separated by commas) and a unit
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s?(ms|us|GB|MB|MiB|k|M|x|s|%)?"
                    r"(?![\w])")
#: how a unit scales the recorded value (seconds, items per second, bytes, a fraction)
SCALE = {"ms": 1e3, "us": 1e6, "k": 1e-3, "M": 1e-6, "GB": 1e-9, "MB": 1e-6, "%": 100.0}
#: notes a cell may carry that are not figures of the results (the aim beside a ratio)
NOTES = re.compile(r"\((?:aim|wanted) [^)]*\)")

#: what a column shows of a row: numbers in order, words (statuses), None (nothing measured)
Expected = float | int | str | None | Sequence[float | int | str | None]


@dataclass(frozen=True)
class Table:
    """A markdown table of a page: where it starts, its header cells and its rows."""

    page: str
    line: int
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class TableSpec:
    """Which results a table of a page quotes, and how.

    ``header`` is the start of the table's header line; ``sources`` names the results files
    (relative to the checkout) by a short name; ``rows`` gives, for each row's label (its
    first cell, cleaned), the key its columns are asked for; ``columns`` gives, for each
    column's header, what it shows of ``(reports, key)``.
    """

    page: str
    header: str
    sources: Mapping[str, str]
    rows: Mapping[str, Any]
    columns: Mapping[str, Callable[[Mapping[str, Any], Any], Expected]]
    generated: Sequence[str] = field(default_factory=tuple)
    """The commands that write the results, for the message when they are missing."""
    label_cells: int = 1
    """How many cells, from the first, name a row (joined by ``" | "``)."""


def clean(cell: str) -> str:
    """A cell without its emphasis, code marks and notes."""
    return re.sub(r"\s+", " ", NOTES.sub("", cell.replace("**", "").replace("`", ""))).strip()


def tables(page: str) -> list[Table]:
    """Every markdown table of ``page`` (relative to the checkout)."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    out: list[Table] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"\|[-:| ]+\|$",
                                                                          lines[i + 1].strip()):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            out.append(Table(page, i + 1, header, rows))
            i = j
        else:
            i += 1
    return out


def numbers(cell: str) -> list[tuple[str, str]]:
    """The figures of a cell: ``(digits as shown, unit)``."""
    return [(m.group(1) + (m.group(2) or ""), m.group(3) or "") for m in NUMBER.finditer(cell)]


def rounded_once(shown: str, unit: str, value: float) -> bool:
    """Whether ``shown`` (in ``unit``) is ``value`` rounded once, at the precision shown."""
    digits = shown.replace(",", "")
    decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    return f"{value * SCALE.get(unit, 1.0):.{decimals}f}" == digits


def _flat(expected: Expected) -> list[float | int | str | None]:
    if expected is None or isinstance(expected, (str, int, float)):
        return [expected]
    return list(expected)


def check_cell(cell: str, expected: Expected) -> str | None:
    """What is wrong with ``cell`` against what it should show, or None."""
    text = clean(cell)
    want = _flat(expected)
    if all(w is None for w in want):
        return None if set(text.replace("/", " ").split()) <= {"-"} else f"{text!r}: nothing was measured"
    if len(want) == 1 and isinstance(want[0], str):  # a text the results hold as it is
        return None if text == want[0] else f"{text!r}: the results say {want[0]!r}"
    figures = numbers(text)
    values = [w for w in want if isinstance(w, (int, float)) and not isinstance(w, bool)]
    words = [w for w in want if isinstance(w, str)]
    if len(figures) != len(values):
        return f"{text!r}: {len(figures)} figures shown, the results have {values}"
    bad = [f"{shown}{unit} is not {value!r} rounded once"
           for (shown, unit), value in zip(figures, values, strict=True)
           if not rounded_once(shown, unit, float(value))]
    bad += [f"{word!r} is missing" for word in words if word not in text]
    return f"{text!r}: " + "; ".join(bad) if bad else None


def load(sources: Mapping[str, str]) -> dict[str, Any]:
    """The results files of ``sources``, by their short names."""
    return {name: json.loads((REPO / path).read_text(encoding="utf-8"))
            for name, path in sources.items()}


def check_table(spec: TableSpec) -> list[str]:
    """Every figure of the table ``spec`` names that differs from its results, as messages;
    a missing table, row or column is one too."""
    found = [t for t in tables(spec.page)
             if ("| " + " | ".join(t.header) + " |").startswith(spec.header)]
    if not found:
        return [f"{spec.page}: no table whose header starts {spec.header!r}"]
    reports = load(spec.sources)
    problems = []
    for table in found:
        where = f"{table.page}:{table.line}"
        labels = {" | ".join(clean(c) for c in row[: spec.label_cells]): row for row in table.rows}
        missing = set(spec.rows) ^ set(labels)
        if missing:
            problems.append(f"{where}: rows {sorted(set(labels) - set(spec.rows))} shown, "
                            f"{sorted(set(spec.rows) - set(labels))} expected")
        columns = {clean(h): i for i, h in enumerate(table.header)}
        for name in set(spec.columns) - set(columns):
            problems.append(f"{where}: no column {name!r}")
        for label, key in spec.rows.items():
            row = labels.get(label)
            if row is None:
                continue
            for name, show in spec.columns.items():
                if name not in columns:
                    continue
                issue = check_cell(row[columns[name]], show(reports, key))
                if issue:
                    problems.append(f"{where}, row {label!r}, column {name!r}: {issue}")
    return problems
