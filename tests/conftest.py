"""Shared fixtures: small real image sets written with Pillow, a real S3 server, real users.

- ``images``, ``client_images``: small JPEG covers (:func:`write_images`).
- ``s3``: a real S3 API (moto) on 127.0.0.1, served by another process that
  counts every request it serves (:class:`benchmarks.common.s3server.S3Process`).
- ``base``, ``accounts``: a ``0o1777`` directory other users can reach, and
  users and groups made for one test (:mod:`tests.support._uids`).
- ``records_store``: a store of 2,000 records of every kind of field, in small data files
  (:func:`tests.support._records.build_box_store`).

With ``TSC_TEST_NO_SKIP=1`` (``.ci/run`` sets it) a skip of the tests that must run in CI
is an error: the trust tests that need root (:data:`MUST_RUN`) and the benchmarks' smoke tests
(a missing extra dependency skips them otherwise).

Helpers: :func:`assert_same_batch` (two batches of records), :func:`gc_under_reader`
(gc removes a namespace while a reader in another process holds its store).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from benchmarks.common.s3server import S3Process

from .support import _uids

NO_SKIP_ENV = "TSC_TEST_NO_SKIP"
#: The test files whose skips :data:`NO_SKIP_ENV` turns into errors.
MUST_RUN = ("tests/test_guarantees/test_permissions.py", "tests/unit/test_trust.py",
            "tests/test_benchmarks/")


def _must_run(nodeid: str) -> bool:
    return os.environ.get(NO_SKIP_ENV, "") not in ("", "0") and any(
        ("tests/" + nodeid.split("tests/", 1)[-1]).startswith(m) for m in MUST_RUN)


def _fail_skip(report: Any) -> None:
    # an expected failure (xfail: a result awaiting its rerun) is reported as skipped too, but
    # it is declared in the test, not caused by a missing dependency: it stays an xfail
    if report.skipped and not hasattr(report, "wasxfail") and _must_run(report.nodeid):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped where {NO_SKIP_ENV} requires it to run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _fail_skip(outcome.get_result())

#: Modules that tests import only in other processes (a model's module, one that imports
#: slowly): --doctest-modules must not import them into the test process.
collect_ignore = ["support/_batch_model.py", "support/_slow_start.py"]


def write_images(root: Path, n: int, *, seed: int = 0, gray_every: int = 0) -> list[str]:
    """Write ``n`` small JPEG covers of varied sizes under ``root``; return their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(20, 60)), int(rng.integers(15, 50))
        sub = root / f"d{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        p = sub / f"img_{i:05d}.jpg"
        if gray_every and i % gray_every == 0:
            Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L").save(p, quality=85)
        else:
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p, quality=85)
        paths.append(str(p))
    return paths


def doctest_setting(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Where the package's docstring examples run: a fresh working directory ``root``.

    It holds ``images/``, eight small covers whose relative paths are the name
    ``paths``; ``TSC_CACHE_DIR`` is a fresh cache in it. Returns the names the
    examples use (``paths``, ``tsc``, ``np``).
    """
    import tensorstore_cache

    monkeypatch.chdir(root)
    monkeypatch.setenv("TSC_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("TSC_CACHE_GROUP", raising=False)
    monkeypatch.delenv("TSC_CACHE_MAX_BYTES", raising=False)
    paths = [os.path.relpath(p, root) for p in write_images(root / "images", 8)]
    return {"paths": paths, "tsc": tensorstore_cache, "np": np}


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    """Sixty small JPEGs, every tenth grayscale."""
    return write_images(tmp_path / "images", 60, gray_every=10)


@pytest.fixture(scope="session")
def client_images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """150 small covers shared by the tests that use the library as its users do.

    With ``workers=2`` a build of them has three shards of 64 rows: the pool's
    worker always builds some, the building process the others.
    """
    return write_images(tmp_path_factory.mktemp("client-images"), 150, seed=9)


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest) -> Iterator[S3Process]:
    """A real S3 API for the tests of one module, holding the bucket its ``BUCKET`` names.

    Skips the test without ``s3fs`` and ``moto[server]``.
    """
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server = S3Process()
    try:
        bucket = getattr(request.module, "BUCKET", None)
        if bucket is not None:
            server.create_bucket(bucket)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def records_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """2,000 sources of records and the store of their records with boxes, built locally
    (the reference) for the tests of one module: every kind of field, in data files of
    about 4 KiB (a shard of a fixed field, a chunk of a ragged field's values), several a
    field."""
    from .support import _records

    return _records.build_box_store(tmp_path_factory.mktemp("records"), 2_000)


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Assert that two batches of records (``take``) hold the same fields and values."""
    import tensorstore_cache as tsc

    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, tsc.Ragged):
            np.testing.assert_array_equal(got[name].values, value.values)
            np.testing.assert_array_equal(got[name].offsets, value.offsets)
            if value.shapes is not None:
                np.testing.assert_array_equal(got[name].shapes, value.shapes)
        elif isinstance(value, list):
            assert got[name] == value
        else:
            np.testing.assert_array_equal(got[name], value)


def gc_under_reader(reader: Callable[..., None], cache: Path, keys: list[str], out: str,
                    timeout_s: float = 120) -> None:
    """Run ``reader(cache, keys, ready, go, out)`` in a spawned process; once it is
    ``ready``, gc removes the one namespace of ``cache`` (``older_than=0``), then the
    reader may ``go`` on and must exit with 0 (what it read, it writes to ``out``)."""
    import tensorstore_cache as tsc

    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    p = ctx.Process(target=reader, args=(str(cache), keys, ready, go, out))
    p.start()
    try:
        assert ready.wait(timeout_s)
        (ns,) = [d for d in cache.iterdir() if d.is_dir() and not d.name.startswith(".")]
        removed = tsc.gc(cache, older_than=0)
        assert [r.path for r in removed] == [str(ns)] and not ns.exists()
        go.set()
        p.join(timeout_s)
        assert p.exitcode == 0, f"the reader died ({p.exitcode})"
    finally:
        if p.is_alive():
            p.kill()


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh ``0o1777`` directory in ``/tmp`` (pytest's own are ``0o700`` under root's)."""
    with _uids.shared_base() as b:
        yield b


@pytest.fixture
def accounts() -> Iterator[_uids.Accounts]:
    """Users and groups made for one test with ``useradd``/``groupadd``, removed after it."""
    if not _uids.have_user_tools():
        pytest.skip("needs useradd and groupadd")
    _uids.remove_leftovers()
    acc = _uids.Accounts()
    try:
        yield acc
    finally:
        acc.close()
