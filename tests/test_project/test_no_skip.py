"""``TSC_TEST_NO_SKIP=1`` (set by ``.ci/run``) turns a skip of a test that must run into a failure.

A real pytest run in another process, over a tree laid out as this repository's tests are,
with this suite's hooks (``tests/conftest.py``): a test of ``tests/test_benchmarks/`` that
skips, and one whose module skips as it is collected, fail under the variable and skip without
it; a skip elsewhere stays a skip, and a declared expected failure (``pytest.xfail``, as a result
awaiting its rerun is marked) stays an xfail under the variable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ..conftest import MUST_RUN, NO_SKIP_ENV

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300  # a guard against hangs, not a timing assertion

SKIPS = "import pytest\n\n\ndef test_skips() -> None:\n    pytest.skip('no such extra')\n"
XFAILS = "import pytest\n\n\ndef test_xfails() -> None:\n    pytest.xfail('awaiting a rerun')\n"
SKIPS_AT_COLLECTION = "import pytest\n\npytest.importorskip('no_such_module_at_all')\n\n\n" \
                      "def test_never_runs() -> None:\n    pass\n"


def _tree(root: Path) -> None:
    (root / "conftest.py").write_text(
        "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n\n"
        "__all__ = ['pytest_make_collect_report', 'pytest_runtest_makereport']\n")
    must = root / "tests" / "test_benchmarks"
    must.mkdir(parents=True)
    (must / "test_must_run.py").write_text(SKIPS)
    (must / "test_must_collect.py").write_text(SKIPS_AT_COLLECTION)
    (must / "test_must_xfail.py").write_text(XFAILS)
    free = root / "tests" / "test_other"
    free.mkdir()
    (free / "test_may_skip.py").write_text(SKIPS)


def _outcomes(root: Path, no_skip: str) -> tuple[dict[str, str], str]:
    env = {k: v for k, v in os.environ.items() if k != NO_SKIP_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env[NO_SKIP_ENV] = no_skip
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-rA",
         "--continue-on-collection-errors",
         "--rootdir", str(root), str(root / "tests")],
        cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    found = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL) (?:\[\d+\] )?(tests/[\w/]+\.py)", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found, proc.stdout + proc.stderr


def test_no_skip_turns_a_must_run_skip_into_a_failure(tmp_path: Path) -> None:
    assert "tests/test_benchmarks/" in MUST_RUN
    _tree(tmp_path)
    must, collect = "tests/test_benchmarks/test_must_run.py", "tests/test_benchmarks/test_must_collect.py"
    free = "tests/test_other/test_may_skip.py"
    xfail = "tests/test_benchmarks/test_must_xfail.py"

    strict, out = _outcomes(tmp_path, "1")
    assert strict == {must: "FAILED", collect: "ERROR", free: "SKIPPED", xfail: "XFAIL"}, out
    assert f"skipped where {NO_SKIP_ENV} requires it to run: " in out, out
    assert "no such extra" in out and "no_such_module_at_all" in out

    lenient, out = _outcomes(tmp_path, "0")  # as if unset
    assert lenient == {must: "SKIPPED", collect: "SKIPPED", free: "SKIPPED", xfail: "XFAIL"}, out
