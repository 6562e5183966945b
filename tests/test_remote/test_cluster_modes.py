"""Nodes that may only read the remote: read-only credentials, and ``$TSC_REMOTE_MODE=read``.

The test S3 server answers 403 ``AccessDenied`` to every write signed with the
access key ``readonly`` (as a bucket policy does); the node agents are
``tests.support._cluster``'s, their loader logs each key it computes.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import Fault, S3Process
from tests.support._cluster import Agent, computed, launch, spec_env

pytest.importorskip("s3fs")

BUCKET = "modes"
KEYS = [f"item/{i:03d}" for i in range(24)]
TTL = 3.0


@pytest.fixture
def prefix(s3: S3Process, request: pytest.FixtureRequest) -> Iterator[str]:
    s3.inject([])
    yield f"s3://{BUCKET}/{request.node.name}"
    s3.inject([])


def _result(agent: Agent) -> dict[str, Any]:
    verdict = agent.result()
    assert verdict["ok"], verdict.get("traceback") or verdict
    assert verdict["wrong"] == 0
    return verdict


def test_read_only_credentials(s3: S3Process, prefix: str, tmp_path: Path) -> None:
    """A node whose credentials may not write gets the cluster's vectors, builds the keys the
    cluster lacks into its own cache only, with one warning naming the remote, and writes
    nothing; its next call is served by its node cache, with no warning."""
    log = tmp_path / "log"
    env = spec_env(log, ttl=TTL)
    _result(launch(tmp_path, "writer", KEYS[:16], prefix, env,
                   storage_options=s3.storage_options()))
    assert sorted(computed(log)) == KEYS[:16]
    s3.inject([Fault("denied", "", method, count=-1, access_key="readonly")
               for method in ("PUT", "POST", "DELETE")])
    s3.reset()
    readonly = dict(s3.storage_options(), key="readonly")
    first = _result(launch(tmp_path, "reader", KEYS, prefix, env, storage_options=readonly))
    assert len(first["warnings"]) == 1 and prefix in first["warnings"][0], first["warnings"]
    assert "read" in first["warnings"][0]
    counts = computed(log)
    assert sorted(counts) == KEYS and max(counts.values()) == 1  # the 8 misses, here
    writes = [r for r in s3.log() if r.method in ("PUT", "POST", "DELETE")]
    assert writes and {r.status for r in writes} == {403}
    s3.reset()
    again = _result(launch(tmp_path, "reader", KEYS, prefix, env, storage_options=readonly))
    assert again["warnings"] == [] and max(computed(log).values()) == 1
    assert [r for r in s3.log() if r.method != "GET"] == []


def test_read_mode_from_the_environment(tmp_path: Path) -> None:
    """``TSC_REMOTE_MODE=read`` on a shared directory: hits served, misses built into the
    node's cache, nothing written to the remote, no warning (it was asked for)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    log = tmp_path / "log"
    _result(launch(tmp_path, "writer", KEYS[:16], str(shared), spec_env(log, ttl=TTL)))
    before = sorted((p, p.stat().st_mtime_ns) for p in shared.rglob("*"))
    reader = _result(launch(tmp_path, "reader", KEYS, str(shared),
                            spec_env(log, ttl=TTL, extra={"TSC_REMOTE_MODE": "read"})))
    assert reader["warnings"] == []
    counts = computed(log)
    assert sorted(counts) == KEYS and max(counts.values()) == 1
    assert sorted((p, p.stat().st_mtime_ns) for p in shared.rglob("*")) == before


def test_an_unknown_mode_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TSC_REMOTE_MODE", "readonly")
    with pytest.raises(ValueError, match=r"TSC_REMOTE_MODE='readonly'"):
        tsc.cached(["a"], cache_dir=tmp_path / "c", remote=str(tmp_path), identity="none",
                   loader=lambda k: [1.0], loader_id="x/1", progress=False)


def test_no_credential_shows(s3: S3Process, prefix: str, tmp_path: Path,
                             caplog: pytest.LogCaptureFixture) -> None:
    """The credentials of ``storage_options`` never appear in ``store.location``, a pickle of
    the store, the node cache's files, a log line, a warning or an error; a URL holding
    credentials is refused with them redacted."""
    key, secret = "AKIDNODE7SEEKRIT", "wJalrXUtnFEMI/K7MDENG/SEEKRITKEY"
    options = dict(s3.storage_options(), key=key, secret=secret)
    caplog.set_level(logging.DEBUG, logger="tensorstore_cache")
    cache = tmp_path / "cache"
    shown: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = tsc.cached(KEYS[:6], cache_dir=cache, remote=prefix, storage_options=options,
                           loader=lambda k: np.ones(2, np.float32), loader_id="cred/1",
                           identity="none", workers=1, progress=False)
        shown += [store.location, repr(store), str(pickle.dumps(store))]
        store.close()
        s3.inject([Fault("denied", "", "PUT", count=-1, access_key=key)])
        tsc.cached(KEYS, cache_dir=cache, remote=prefix, storage_options=options,
                   loader=lambda k: np.ones(2, np.float32), loader_id="cred/1",
                   identity="none", workers=1, progress=False).close()
        s3.inject([Fault("ignore_conditions", "", "PUT", count=-1)])
        with pytest.raises(tsc.UnsafeRemoteError) as refused:
            tsc.cached(KEYS[:2], cache_dir=tmp_path / "other", remote=prefix + "/x",
                       storage_options=options, loader=lambda k: np.ones(2, np.float32),
                       loader_id="cred/1", identity="none", workers=1, progress=False)
    with pytest.raises(ValueError) as in_url:
        tsc.cached(["a"], cache_dir=cache, remote=f"s3://{key}:{secret}@{BUCKET}/p",
                   loader=lambda k: [1.0], loader_id="cred/1", identity="none")
    assert "***" in str(in_url.value)
    # the library's warnings: a warning of other code that the block happens to catch (the
    # garbage collector finalizing an earlier test's object, say) is not this test's subject,
    # though its text is searched for the credentials below like every other
    ours = [w for w in caught if not issubclass(w.category, (ResourceWarning, DeprecationWarning))]
    assert len(ours) == 1 and prefix in str(ours[0].message), [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    shown += [str(w.message) for w in caught] + [caplog.text, str(refused.value),
                                                  str(in_url.value)]
    shown += [p.read_bytes().decode("latin-1") for p in cache.rglob("*") if p.is_file()]
    for text in shown:
        assert key not in text and secret not in text
