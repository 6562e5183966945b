"""The committed objects of remote layout 1 (``tests/data/remote_v1/``): read, and written again.

``tests/data/make_remote_v1.py`` wrote them once (its docstring says what they
are): a cluster's namespace on a shared directory after two nodes' calls, with
every kind of remote object. Every object is read back by the reader of its
kind, a node serves the namespace's vectors computing nothing and writing
nothing to the remote, and :func:`test_a_rebuild_writes_the_same_objects` fails
as soon as the writer writes an object differently (tokens, part ids, build
times, hosts and pids aside).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import tensorstore_cache as tsc
from tensorstore_cache.fs import file_digest
from tensorstore_cache.remote import (
    BUNDLE_SUFFIX,
    REMOTE_VERSION,
    Bundle,
    check_document,
    parse_manifest,
)

from ..data.make_format_v1 import _set_mtimes
from ..data.make_remote_v1 import (
    DATA,
    FIRST_CALL,
    FIRST_NS,
    LOADER,
    SECOND_CALL,
    SKIPPED,
    RemoteRawLoader,
    build_all,
)

KEYS = sorted({*FIRST_CALL, *SECOND_CALL} - {SKIPPED})
_PART_ID = re.compile(r"[0-9a-f]{8,16}-[0-9a-f]{8}")
_TOKEN = re.compile(r"[0-9a-f]{32}")


def namespace_of(remote: Path) -> Path:
    (ns,) = [p for p in remote.iterdir() if p.name != ".tsc-probe"]
    return ns


def _json(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_the_committed_objects_are_there() -> None:
    ns = namespace_of(DATA / "remote")
    assert sorted(p.name for p in (ns / "manifests").iterdir()) == ["00000001.json",
                                                                    "00000002.json"]
    assert (ns / "head.json").is_file() and len(list((ns / "leases").iterdir())) == 2
    assert len(list((ns / "parts").glob(f"*{BUNDLE_SUFFIX}"))) == 2
    assert len(list((ns / "parts").glob("*/zarr.json"))) == 2
    assert len(list((DATA / "remote" / ".tsc-probe").iterdir())) == 2
    for key in (*FIRST_CALL, *SECOND_CALL):
        assert (DATA / key).is_file(), key


def test_every_object_is_read_as_its_kind_and_version() -> None:
    """Manifests, the head hint, leases and probes are JSON objects holding their kind and
    version 1; every part named has its store and a bundle matching the size and XXH3-128
    the manifest records, holding the part's metadata, index and sources' content hashes."""
    assert REMOTE_VERSION == 1
    ns = namespace_of(DATA / "remote")
    first = parse_manifest(_json(ns / "manifests/00000001.json"), 1, "m1")
    second = parse_manifest(_json(ns / "manifests/00000002.json"), 2, "m2")
    assert first.skipped == (SKIPPED,) and second.skipped == ()
    assert len(first.parts) == 1 and second.parts[0] == first.parts[0] and len(second.parts) == 2
    head = _json(ns / "head.json")
    check_document(head, "head", "head.json")
    assert head["generation"] == 2 and parse_manifest(head["manifest"], 2, "head") == second
    for lease in (ns / "leases").iterdir():
        doc = _json(lease)
        check_document(doc, "lease", str(lease))
        assert doc["state"] == "released" and doc["beats"] == -1 and _TOKEN.fullmatch(doc["writer"])
    for probe in (DATA / "remote" / ".tsc-probe").iterdir():
        check_document(_json(probe), "probe", str(probe))
    for ref in second.parts:
        part = ns / "parts" / ref.id
        bundle_path = part.with_name(ref.id + BUNDLE_SUFFIX)
        assert file_digest(bundle_path) == (ref.size, ref.xxh3)
        bundle = Bundle.read(bundle_path, ref.id, str(bundle_path))
        assert next(iter(bundle.files)) == "zarr.json"
        for rel in bundle.files:
            assert bundle.read_file(rel) == (part / rel).read_bytes(), rel
        assert not [rel for rel in bundle.files if "/c/" in rel and rel.startswith("vectors/")]
        side = bundle.side_bytes()
        with tsc.open_store(part) as store:
            assert side is not None and len(side) == 8 * len(store)
        assert xxhash.xxh3_128_hexdigest((part / "zarr.json").read_bytes()) == ref.group


def test_a_version_this_release_does_not_read_is_refused() -> None:
    doc = _json(namespace_of(DATA / "remote") / "manifests/00000002.json")
    with pytest.raises(tsc.CorruptStoreError, match="upgrade tensorstore_cache"):
        parse_manifest({**doc, "version": 2}, 2, "m2")
    with pytest.raises(tsc.CorruptStoreError, match="not a manifest"):
        parse_manifest({**doc, "kind": "tensorstore_cache.remote.lease"}, 2, "m2")
    with pytest.raises(tsc.CorruptStoreError, match="not a manifest"):
        parse_manifest({k: v for k, v in doc.items() if k != "kind"}, 2, "m2")


class _Refusing(RemoteRawLoader):
    """The loader of the committed namespace, refusing to compute."""

    def __call__(self, path: str) -> Any:
        raise AssertionError(f"{path} was computed again")


def test_a_node_serves_the_committed_namespace_computing_and_writing_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "remote_v1"
    shutil.copytree(DATA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    _set_mtimes(copy, FIRST_NS)  # the times recorded at the builds (a clone has others)
    before = {p: p.read_bytes() for p in (copy / "remote").rglob("*") if p.is_file()}
    monkeypatch.chdir(copy)
    store = tsc.cached(KEYS, cache_dir=tmp_path / "node", remote=str(copy / "remote"),
                       loader=_Refusing("float32", (3,)), workers=1, progress=False)
    with store:
        assert len(store) == len(KEYS) and store.paths == KEYS
        for key in KEYS:
            np.testing.assert_array_equal(store[key], LOADER(key))
    after = {p: p.read_bytes() for p in (copy / "remote").rglob("*") if p.is_file()}
    assert after == before  # a node that only reads writes nothing, not even a probe


# -- written again: the same objects ---------------------------------------------
#
# Replaced before the comparison, and only these: the part ids (time and random bits:
# in object names, manifests, the head and bundle headers), the probes' names and the
# writers' tokens (random), the hosts and pids of the leases, the build times in the
# parts' group zarr.json, and what depends on those times: a bundle's size and XXH3-128
# and the XXH3-128 of its part's group zarr.json, as the manifests record them.

_TIME = re.compile(rb'"created_unix": [0-9.eE+-]+')
_VOLATILE = {"writer": "<token>", "host": "<host>", "pid": "<pid>", "size": "<size>",
             "xxh3": "<xxh3>", "group_xxh3": "<xxh3>"}


def _scrub(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _VOLATILE.get(k, _scrub(v, ids)) if k != "id" else ids[v]
                for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, ids) for v in value]
    return value


def _normalised(root: Path) -> dict[str, Any]:
    """Every object under ``root/remote``, its volatile parts replaced."""
    ns = namespace_of(root / "remote")
    order = [p["id"] for p in _json(ns / "manifests/00000002.json")["parts"]]
    ids = {part: f"<part{k}>" for k, part in enumerate(order)}
    out: dict[str, Any] = {}
    for path in sorted((root / "remote").rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root / "remote").as_posix()
        rel = _TOKEN.sub("<token>", rel) if rel.startswith(".tsc-probe/") else rel
        for part, name in ids.items():
            rel = rel.replace(part, name)
        assert not _PART_ID.search(rel), rel
        raw = path.read_bytes()
        if rel.endswith(".json") and "/parts/" not in rel:  # manifests, head, leases, probes
            value: Any = _scrub(json.loads(raw), ids)
        elif rel.endswith(BUNDLE_SUFFIX):
            part = path.name.removesuffix(BUNDLE_SUFFIX)
            bundle = Bundle.read(path, part, rel)
            value = {"files": {f: _TIME.sub(b"<time>", bundle.read_file(f)) for f in bundle.files},
                     "side": bundle.side_bytes()}
        else:
            value = _TIME.sub(b"<time>", raw)
        out.setdefault(rel, []).append(value)
    return out


def test_a_rebuild_writes_the_same_objects(tmp_path: Path) -> None:
    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(DATA / "sources", again / "sources")
    build_all(again)
    committed, rebuilt = _normalised(DATA), _normalised(again)
    assert sorted(rebuilt) == sorted(committed)
    differ = [rel for rel in committed if committed[rel] != rebuilt[rel]]
    assert differ == [], f"the writer now writes other objects: {differ}: a new remote version?"
