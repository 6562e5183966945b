"""The stats a node found to hold the recorded bytes of copied sources (``remote=``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.cache.seen_sources import FILE, NodeSeenSources
from tensorstore_cache.errors import CorruptStoreError
from tensorstore_cache.fs import hash_many, stat_many
from tensorstore_cache.reader.sources import SourceIdentity, stale_mask


def _namespace(tmp_path: Path) -> Namespace:
    ns = Namespace(tmp_path / "cache" / "ns", {"kind": "x"})
    ns.root.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "cache", 0o700)
    return ns


def _recorded(keys: list[str]) -> SourceIdentity:
    """What another machine recorded of the same bytes: another mtime, their hash."""
    size, mtime = stat_many(keys)
    return SourceIdentity(size, mtime - 10**12, hash_many(keys))


def test_a_copy_is_read_once_then_known_by_its_stat(tmp_path: Path) -> None:
    """A copy (another mtime, same bytes) is current; read once, then judged by its stat;
    a copy modified too recently for its stat to tell is read every time; other bytes are
    stale."""
    old, recent, other = (tmp_path / n for n in ("old", "recent", "other"))
    for p in (old, recent, other):
        p.write_bytes(b"same bytes")
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    keys = [str(old), str(recent), str(other)]
    recorded = _recorded(keys)
    other.write_bytes(b"diff bytes")
    os.utime(other, (past, past))
    ns = _namespace(tmp_path)
    seen = NodeSeenSources(ns)
    assert stale_mask(keys, recorded, seen=seen).tolist() == [False, False, True]
    seen.save()
    again = NodeSeenSources(ns)
    s, m, h = again.lookup(keys)
    assert recorded.content_hash is not None
    assert s.tolist()[0] == old.stat().st_size and h.tolist()[0] == recorded.content_hash[0]
    assert m.tolist()[1:] == [-1, -1]  # the recent one is not remembered, the other not same
    assert stale_mask(keys, recorded).tolist() == [True, True, True]  # without: by stat
    np.testing.assert_array_equal(stale_mask(keys, recorded, seen=again), [False, False, True])


def test_a_damaged_file_is_named(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    (ns.root / FILE).write_bytes(b"not a numpy archive")
    os.chmod(ns.root / FILE, 0o600)
    with pytest.raises(CorruptStoreError, match=FILE):
        NodeSeenSources(ns).lookup(["x"])
