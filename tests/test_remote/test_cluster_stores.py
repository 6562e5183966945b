"""``remote=`` on Google Cloud Storage and Azure Blob Storage, and the URLs it refuses.

``gs://`` and ``az://`` go through the same create-only write as ``s3://``
(gcsfs sends ``ifGenerationMatch=0``, adlfs ``If-None-Match: *``), against
local emulators in their own processes (:mod:`tests.support._emulators`): 3
nodes start at once, each key is computed once, the store probe passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorstore_cache as tsc
from tests.support._cluster import computed, launch, spec_env
from tests.support._emulators import Azurite, FakeGCS, start_azurite, start_fake_gcs

KEYS = [f"item/{i:03d}" for i in range(20)]


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Azurite | FakeGCS]]:
    if request.param == "gs":
        gcs = start_fake_gcs()
        try:
            gcs.create_bucket("tsc")
            yield "gs://tsc/cache", gcs
        finally:
            gcs.stop()
    else:
        azurite = start_azurite()
        try:
            azurite.create_container("tsc")
            yield "az://tsc/cache", azurite
        finally:
            azurite.stop()


def test_once_per_cluster(store: tuple[str, Azurite | FakeGCS], tmp_path: Path) -> None:
    """3 nodes at once on the store: every key computed once in the cluster, every vector
    right; the store probe (run before a node's first write) found create-only writes."""
    url, emulator = store
    log = tmp_path / "log"
    start = tmp_path / "start"
    agents = [launch(tmp_path, f"n{n}", KEYS, url, spec_env(log, ttl=3.0, extra=emulator.env),
                     storage_options=emulator.storage_options(), start=start) for n in range(3)]
    for agent in agents:
        agent.wait_ready()
    start.touch()
    for agent in agents:
        verdict = agent.result()
        assert verdict["ok"], verdict.get("traceback") or verdict
        assert verdict["wrong"] == 0
    counts = computed(log)
    assert sorted(counts) == KEYS and max(counts.values()) == 1
    verdicts = [p.read_text() for p in tmp_path.glob("n*/remote/probes/*.json")]
    assert verdicts and all('"honours_create_only": true' in v for v in verdicts)


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:hunter2@example.com/cache", "http://***@example.com/cache"),
    ("memory://cache?sig=hunter2", "memory://cache?sig=***"),
    ("hdfs://namenode/cache", "hdfs://namenode/cache"),
])
def test_a_store_without_create_only_writes_is_refused(url: str, shown: str,
                                                         tmp_path: Path) -> None:
    """A URL of a store that gives no create-only write is refused before anything runs: the
    message names it (its credentials redacted) and says what is supported."""
    with pytest.raises(ValueError) as caught:
        tsc.cached(["a"], cache_dir=tmp_path, remote=url, loader=lambda k: [1.0],
                   loader_id="x/1", identity="none", progress=False)
    message = str(caught.value)
    assert "hunter2" not in message and repr(shown) in message
    for supported in ("s3://", "gs://", "az://", "directory"):
        assert supported in message
    assert not list(tmp_path.iterdir())  # nothing made
