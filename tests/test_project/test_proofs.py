"""Every statement of ``docs/guarantees.md`` names its proof, and the proof exists.

The page is made of sections (``##``), each an introduction and then statements: bullets
(``- **Title.** ...``), each ending with ``Proof:`` and, as code spans, the pytest ids of the
tests that prove it (``tests/<area>/test_x.py::test_name``) or, for a figure of time or
memory, the committed results file of the benchmark that measured it
(``benchmarks/results/<name>/<file>.json``). Text outside a statement, once a section's
statements have begun, is refused: every promise is a statement. The ids are collected by
pytest itself, so a renamed or removed test fails here; a results file must exist and be
stamped with the run that wrote it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common._stamp import unstamped

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guarantees.md"
PROOF = re.compile(r"Proof:((?:\s*`[^`]+`,?)+)\.")
TEST_ID = re.compile(r"tests/[\w/]+\.py::test_\w+")
RESULTS = re.compile(r"benchmarks/results/[\w-]+/[\w.-]+\.json")
COLLECT_S = 300  # a guard against hangs, not a timing assertion


def sections(text: str) -> list[tuple[str, list[str]]]:
    """``(heading, lines)`` of every section: the title's section (``#``), then each ``##``."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(("# ", "## ")):
            out.append((line.lstrip("# "), []))
        elif out:
            out[-1][1].append(line)
    return out


def statements(text: str) -> dict[str, str]:
    """Each statement of the page, by ``section: title``; a ``ValueError`` for text between
    or after them that is not part of one (an unindented line once the bullets have begun)."""
    found: dict[str, list[str]] = {}
    for heading, lines in sections(text):
        current: list[str] | None = None
        for n, line in enumerate(lines):
            if line.startswith("- **"):
                current = found.setdefault(f"{heading}: {line[4:].split('**', 1)[0]}", [])
                current.append(line[2:])
            elif current is not None and (line.startswith("  ") or not line.strip()):
                current.append(line[2:])
            elif current is not None:
                raise ValueError(f"{heading!r}, line {n + 1} of the section, is outside every "
                                 f"statement: {line[:80]!r}")
    return {key: "\n".join(lines).strip() for key, lines in found.items()}


def proofs(item: str) -> list[str]:
    """The proofs a statement names; fails unless ``Proof:`` ends its prose."""
    found = PROOF.search(item)
    assert found is not None, "no 'Proof:' followed by test ids or results files"
    rest = item[found.end():].strip()
    assert rest == "" or rest.startswith("```"), f"the proof does not end it: {rest[:80]!r}"
    ids = re.findall(r"`([^`]+)`", found.group(1))
    bad = [i for i in ids if not (TEST_ID.fullmatch(i) or RESULTS.fullmatch(i))]
    assert not bad, f"neither a test id nor a results file: {bad}"
    return ids


def collected(files: set[str]) -> set[str]:
    """The ids pytest collects from ``files``, parameters stripped."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", *sorted(files)],
        cwd=REPO, capture_output=True, text=True, timeout=COLLECT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line.split("[", 1)[0] for line in proc.stdout.splitlines() if "::" in line}


def results_problems(names: set[str]) -> list[str]:
    """What is wrong with the results files ``names``: missing, not JSON, not stamped."""
    problems = []
    for name in sorted(names):
        path = REPO / name
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if unstamped(report):
            problems.append(f"{name}: {', '.join(unstamped(report))} not stamped")
    return problems


def test_every_statement_of_the_page_ends_with_proofs_that_exist() -> None:
    text = PAGE.read_text()
    items = statements(text)
    assert len(items) >= 20, list(items)
    for heading, _lines in sections(text):  # every section holds statements
        assert any(key.startswith(f"{heading}: ") for key in items), heading
    named = {title: proofs(item) for title, item in items.items()}
    ids = {i for group in named.values() for i in group}
    tests = {i for i in ids if "::" in i}
    missing = tests - collected({i.split("::", 1)[0] for i in tests})
    assert not missing, f"named on the page but not collected: {sorted(missing)}"
    assert results_problems(ids - tests) == []


def test_a_statement_without_proof_or_with_a_missing_proof_is_caught(tmp_path: Path) -> None:
    page = ("# G\n\nIntro.\n\n- **A.** Does a.\n  Proof: `tests/test_x.py::test_a`.\n"
            "- **B.** Does b.\n\n## L\n\n- **C.** Takes c s.\n"
            "  Proof: `benchmarks/results/c/c.json`, `tests/test_x.py::test_c`.\n")
    items = statements(page)
    assert list(items) == ["G: A.", "G: B.", "L: C."]
    assert proofs(items["G: A."]) == ["tests/test_x.py::test_a"]
    assert proofs(items["L: C."]) == ["benchmarks/results/c/c.json", "tests/test_x.py::test_c"]
    with pytest.raises(AssertionError, match="no 'Proof:'"):
        proofs(items["G: B."])
    with pytest.raises(AssertionError, match="neither a test id nor a results file"):
        proofs("- **D.** Does d.\n  Proof: `tests/test_x.py`.")
    with pytest.raises(ValueError, match="outside every statement"):
        statements(page + "\nA promise in a paragraph of its own.\n")
    here = "tests/test_project/test_proofs.py"
    got = collected({here})
    assert f"{here}::test_every_statement_of_the_page_ends_with_proofs_that_exist" in got
    assert f"{here}::test_no_such_test" not in got
    assert results_problems({"benchmarks/results/no/such.json"})[0].startswith(
        "benchmarks/results/no/such.json: ")
