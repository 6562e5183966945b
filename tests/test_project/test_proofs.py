"""Every promise of ``docs/guarantees.md`` names the tests that prove it, and they exist.

Each statement of the page (each bullet before its "Limits") ends with ``Proof:`` and pytest
ids as code spans (``tests/<area>/test_x.py::test_name``); the ids are collected by pytest
itself, so a renamed or removed test fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guarantees.md"
PROOF = re.compile(r"Proof:((?:\s*`[^`]+`,?)+)\.")
TEST_ID = re.compile(r"tests/[\w/]+\.py::test_\w+")
COLLECT_S = 300  # a guard against hangs, not a timing assertion


def promises(text: str) -> dict[str, str]:
    """Each bullet of the page before its first ``##`` heading, by its bold title."""
    body = text.split("\n## ", 1)[0]
    items = re.split(r"\n- \*\*", body)[1:]
    return {item.split("**", 1)[0]: item for item in items}


def proofs(item: str) -> list[str]:
    """The test ids a statement names; fails unless ``Proof:`` ends its prose."""
    found = PROOF.search(item)
    assert found is not None, "no 'Proof:' followed by test ids"
    rest = item[found.end():].strip()
    assert rest == "" or rest.startswith("```"), f"the proof does not end it: {rest[:80]!r}"
    ids = re.findall(r"`([^`]+)`", found.group(1))
    bad = [i for i in ids if not TEST_ID.fullmatch(i)]
    assert not bad, f"not a test id: {bad}"
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


def test_every_promise_ends_with_proofs_that_exist() -> None:
    items = promises(PAGE.read_text())
    assert len(items) >= 12, list(items)
    named = {title: proofs(item) for title, item in items.items()}
    ids = {i for group in named.values() for i in group}
    missing = ids - collected({i.split("::", 1)[0] for i in ids})
    assert not missing, f"named on the page but not collected: {sorted(missing)}"


def test_a_statement_without_proof_or_with_a_missing_test_is_caught() -> None:
    page = "# G\n\n- **A.** Does a.\n  Proof: `tests/test_x.py::test_a`.\n- **B.** Does b.\n\n## L\n"
    items = promises(page)
    assert proofs(items["A."]) == ["tests/test_x.py::test_a"]
    try:
        proofs(items["B."])
    except AssertionError as exc:
        assert "no 'Proof:'" in str(exc)
    else:
        raise AssertionError("a statement without proof was accepted")
    here = "tests/test_project/test_proofs.py"
    got = collected({here})
    assert f"{here}::test_every_promise_ends_with_proofs_that_exist" in got
    assert f"{here}::test_no_such_test" not in got
