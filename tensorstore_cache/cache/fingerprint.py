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

from ..format.spec import FORMAT_VERSION

__all__ = ["LAYOUT_VERSION", "NAMESPACE_KIND", "canonical_json", "fingerprint", "namespace_name"]

#: Version of the namespace layout (part of every fingerprint).
LAYOUT_VERSION = 1
#: ``kind`` of a namespace description (``namespace.json``).
NAMESPACE_KIND = "tensorstore_cache.namespace"


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value`` (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def fingerprint(loader_id: str, loader_params: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Return everything that determines a vector, as canonical JSON values.

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
    return {
        "kind": NAMESPACE_KIND,
        "layout": LAYOUT_VERSION,
        "format_version": FORMAT_VERSION,
        "loader_id": loader_id,
        "loader_params": params,
        "dtype": dtype,
    }


def namespace_name(fp: dict[str, Any]) -> str:
    """Return the directory name of a fingerprint: a readable slug and a BLAKE2b digest."""
    digest = hashlib.blake2b(canonical_json(fp).encode(), digest_size=10).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9_.]+", "_", str(fp["loader_id"])).strip("._")[:40] or "loader"
    return f"{slug}-{fp['dtype']}-{digest}"
