"""Whether damage to a store's file is named: the fuzz tests' oracle.

:func:`damage_is_named` compares a file of a damaged copy of a store with the pristine
store's. When it differs (a metadata document: when it decodes to another value, its bytes'
layout aside), :func:`tensorstore_cache.verify_store` must fail and name it. The group
``zarr.json`` records every other file's size and checksum, so a change of those records is
named by the file whose record no longer matches; and it records the store's provenance
(the loader, its parameters, the skipped sources, the creation time), which nothing can check
against the data: a change of provenance alone leaves the store verified, and the store must
then read exactly the pristine store's data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc

__all__ = ["PROVENANCE", "damage_is_named"]

ATTR = "tensorstore_cache"
GROUP = "zarr.json"
#: what the group document records about where the data came from, not about the data
PROVENANCE = ("created_unix", "loader_id", "loader_params", "skipped", "source_identity")


def _decoded(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data  # not JSON at all: its bytes are the document


def _canonical(document: Any) -> str | bytes:
    return document if isinstance(document, bytes) else json.dumps(document, sort_keys=True)


def _attrs(document: Any) -> dict[str, Any] | None:
    try:
        attrs = document["attributes"][ATTR]
    except (KeyError, TypeError, IndexError):
        return None
    return attrs if isinstance(attrs, dict) else None


def _record_changes(before: Any, after: Any) -> set[str] | None:
    """The files whose records in the group document changed, if nothing but those records
    and the provenance changed; else None."""
    a, b = _attrs(before), _attrs(after)
    if a is None or b is None or not isinstance(after, dict):
        return None
    rest = ("files", *PROVENANCE)
    same_rest = _canonical({k: v for k, v in a.items() if k not in rest}) == _canonical(
        {k: v for k, v in b.items() if k not in rest})
    outside = {k: v for k, v in after.items() if k != "attributes"} == {
        k: v for k, v in before.items() if k != "attributes"} and list(after["attributes"]) == [ATTR]
    files_a, files_b = a.get("files"), b.get("files")
    if not (same_rest and outside and isinstance(files_a, dict) and isinstance(files_b, dict)):
        return None
    if set(files_a) != set(files_b):
        return None
    return {rel for rel in files_a if _canonical(files_a[rel]) != _canonical(files_b[rel])}


def _reads_the_same(root: Path, pristine: Path) -> None:
    with tsc.open_store(root) as got, tsc.open_store(pristine) as want:
        assert got.paths == want.paths
        rows = np.arange(len(want))
        a, b = got.take(rows), want.take(rows)
        if isinstance(b, dict):
            from ..conftest import assert_same_batch

            assert_same_batch(a, b)
        else:
            np.testing.assert_array_equal(a, b)


def damage_is_named(root: Path, pristine: Path, rel: str) -> None:
    """When ``root/rel`` differs from ``pristine/rel``, ``verify_store(root)`` fails naming it
    (see the module's docstring for the group document's records and provenance)."""
    data, clean = (root / rel).read_bytes(), (pristine / rel).read_bytes()
    is_json = rel.endswith(GROUP)
    if data == clean or (is_json and _canonical(_decoded(data)) == _canonical(_decoded(clean))):
        return
    report = tsc.verify_store(root)
    bad = set(report.bad_files)
    changed = _record_changes(_decoded(clean), _decoded(data)) if rel == GROUP else None
    if report.ok:
        assert changed == set(), f"{rel} was changed and the store verified"
        _reads_the_same(root, pristine)  # its provenance alone changed
        return
    named = {os.path.join(str(root), rel)}
    if changed:  # the records of these files changed: each is named as not matching them
        named |= {os.path.join(str(root), r) for r in changed}
    assert bad and bad <= named and (os.path.join(str(root), rel) in bad or changed), (
        rel, sorted(bad), sorted(changed or ()))
