"""The doctests' setting: each example of the package's docstrings runs in a fresh directory.

For an item collected by ``--doctest-modules`` (and only for those), the
working directory is a new temporary one holding ``images/``, eight small JPEG
covers, whose paths are the name ``paths``; ``TSC_CACHE_DIR`` is a fresh cache
there, and ``tsc`` and ``np`` are imported (``tests.conftest.doctest_setting``).
So an example reads as a user writes it:
``store = tsc.build_store(paths, "covers.tsc")``.

``pytest --without-torch`` (``make test-matrix``, on other Pythons and releases) leaves out
:data:`NEEDS_TORCH`; without it, the tests need torch and refuse to start where it is missing,
so that no test that imports torch is skipped for want of it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

#: What needs torch, the peers of the benchmarks or the tools of the docs (mkdocs): the folders
#: and modules ``--without-torch`` does not collect. A test elsewhere that needs torch imports it
#: with ``pytest.importorskip("torch")``; a module that imports it at the top belongs here (the
#: matrix fails to collect it otherwise).
NEEDS_TORCH = (
    "tensorstore_cache/torch",
    "tests/support/_ddp_train.py",
    "tests/test_api/test_loader.py",
    "tests/test_benchmarks",
    "tests/test_project",
    "tests/test_records/test_records_torch.py",
    "tests/test_torch",
)
ROOT = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-torch", action="store_true",
        help="leave out what needs torch, the peers or the docs' tools (conftest.NEEDS_TORCH), "
        "as the matrix does (make test-matrix)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--without-torch") and importlib.util.find_spec("torch") is None:
        raise pytest.UsageError(
            "torch is not installed: the tests that need it would be skipped. Run them in "
            "the venv `make install` sets up (.venv), or pass --without-torch to leave them out"
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    path = collection_path.resolve()
    if config.getoption("--without-torch") and path.is_relative_to(ROOT):
        return True if path.relative_to(ROOT).as_posix() in NEEDS_TORCH else None
    return None


@pytest.fixture(autouse=True)
def _doctest_covers(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not isinstance(request.node, pytest.DoctestItem):
        return
    from tests.conftest import doctest_setting

    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(doctest_setting(tmp_path, monkeypatch))
