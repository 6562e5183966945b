"""Naming what a vector is: the fingerprint of a namespace and its directory name.

Everything that determines a vector (loader id and parameters, dtype, format
version, namespace layout) is written as canonical JSON; its BLAKE2b digest
names the namespace, so different transforms never share vectors.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ..format import FORMAT_VERSION, RECORDS_VERSION, canonical_json, schema_to_json
from ..writer import Schema

__all__ = [
    "LAYOUT_VERSION", "NAMESPACE_KIND", "canonical_json", "fingerprint", "namespace_name", "slug",
]

#: Version of the namespace layout (part of every fingerprint).
LAYOUT_VERSION = 1
#: ``kind`` of a namespace description (``namespace.json``).
NAMESPACE_KIND = "tensorstore_cache.namespace"


def fingerprint(
    loader_id: str,
    loader_params: dict[str, Any],
    dtype: str,
    schema: Schema | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Return everything that determines a vector, as canonical JSON values.

    A cache of one tensor per key (no ``schema``, no ``names``) keeps the
    fingerprint of every earlier release (a loader that returns records
    there gets a schema inferred at the first build, recorded in its parts
    and enforced afterwards). Declared fields add ``format_version: 2`` and
    the schema (``names`` alone: ``"inferred"`` and the names).

    Raises
    ------
    TypeError
        If the loader's parameters are not JSON values.
    """
    try:
        params = json.loads(canonical_json(loader_params))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the loader's params {loader_params!r} must be JSON values (str, int, float, bool, "
            f"None, lists and dicts of them): {exc}; they name the cache the vectors go to"
        ) from None
    fp: dict[str, Any] = {
        "kind": NAMESPACE_KIND,
        "layout": LAYOUT_VERSION,
        "format_version": FORMAT_VERSION,
        "loader_id": loader_id,
        "loader_params": params,
        "dtype": dtype,
    }
    if schema is not None:
        fp.update(format_version=RECORDS_VERSION, fields=schema_to_json(schema))
    elif names is not None:
        fp.update(format_version=RECORDS_VERSION, fields="inferred", field_names=list(names))
    return fp


def namespace_name(fp: dict[str, Any]) -> str:
    """Return the directory name of a fingerprint: a readable slug and a BLAKE2b digest."""
    digest = hashlib.blake2b(canonical_json(fp).encode(), digest_size=10).hexdigest()
    return f"{slug(str(fp['loader_id']))}-{fp['dtype']}-{digest}"


def slug(loader_id: str) -> str:
    """The readable start of a namespace's directory name: ``loader_id``, sanitised, cut."""
    return re.sub(r"[^A-Za-z0-9_.]+", "_", loader_id).strip("._")[:40] or "loader"
