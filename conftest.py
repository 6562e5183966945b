"""The doctests' setting: each example of the package's docstrings runs in a fresh directory.

For an item collected by ``--doctest-modules`` (and only for those), the
working directory is a new temporary one holding ``images/``, eight small JPEG
covers, whose paths are the name ``paths``; ``TSC_CACHE_DIR`` is a fresh cache
there, and ``tsc`` and ``np`` are imported (``tests.conftest.doctest_setting``).
So an example reads as a user writes it:
``store = tsc.build_store(paths, "covers.tsc")``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _doctest_covers(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not isinstance(request.node, pytest.DoctestItem):
        return
    from tests.conftest import doctest_setting

    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(doctest_setting(tmp_path, monkeypatch))
