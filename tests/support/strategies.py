"""Reusable hypothesis strategies for tensorstore_cache tests.

``json_values`` draws any JSON value (including the awkward ones: huge and
negative integers, floats, empty containers, unicode and NUL in strings);
``mutated_json`` takes a valid document and damages it at a random place, the
way a bit rot, a careless edit or an attacker would; ``source_paths`` draws
the file names a user could hand to ``build_store``.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "json_scalars",
    "json_values",
    "mutated_json",
    "small_json",
    "source_paths",
    "suspicious_numbers",
    "suspicious_strings",
]

#: Numbers that break naive size arithmetic.
suspicious_numbers = st.sampled_from(
    [0, -1, 1, 2, 3, 7, 255, 256, 2**31 - 1, 2**31, 2**32, 2**40, 2**48, 2**53 + 1, 2**62,
     2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30, 0.5, -0.0, 1e308, 3.0]
)

#: Strings that break naive path and type handling.
suspicious_strings = st.sampled_from(
    ["", ".", "..", "../x", "../../etc/passwd", "/etc/passwd", "a/../../b", "vectors/../..",
     "a\x00b", "\x00", "|O", "object", "<U10", "O", "V8", "numcodecs.pickles", "pickle",
     "gzip", "blosc", "zstd", "bytes", "crc32c", "sharding_indexed", "float32", "<f4",
     "uint8", "big", "little", "regular", "default", "group", "array", "é", "ü",
     "x" * 300]
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    suspicious_numbers,
    suspicious_strings,
)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Any JSON value, nested a few levels."""
    return st.recursive(
        json_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(st.one_of(st.text(max_size=10), suspicious_strings), children, max_size=5),
        ),
        max_leaves=max_leaves,
    )


#: Small JSON values, cheap to draw (what a damage puts in place).
small_json = st.one_of(
    suspicious_numbers,
    suspicious_strings,
    json_scalars,
    st.lists(json_scalars, max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=5), suspicious_strings), json_scalars, max_size=3),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys/indices) to a node of a JSON document."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@st.composite
def mutated_json(draw: st.DrawFn, document: dict[str, Any], rounds: int = 3) -> Any:
    """``document`` with one to ``rounds`` random damages.

    Each damage picks a node and replaces it by another JSON value (often a
    suspicious number or string), deletes it, adds a key or an element next
    to it, or nudges a number by one.
    """
    doc: Any = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, rounds))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "insert", "nudge", "retype"]))
        if not path:  # the root
            if action in ("replace", "retype"):
                doc = draw(json_values())
            continue
        parent = _get(doc, path[:-1])
        key = path[-1]
        node = parent[key]
        if action == "replace":
            parent[key] = draw(small_json)
        elif action == "delete":
            del parent[key]
        elif action == "insert":
            if isinstance(parent, dict):
                parent[draw(st.one_of(suspicious_strings, st.text(max_size=8)))] = draw(small_json)
            else:
                parent.insert(key, draw(small_json))
        elif action == "nudge" and type(node) is int:
            parent[key] = node + draw(st.sampled_from([-1, 1, -node - 1, 2**32, 2**63]))
        elif action == "retype":
            parent[key] = draw(
                st.sampled_from([str(node), [node], {"v": node}, None, float(len(str(node)))])
            )
    return doc


def source_paths() -> st.SearchStrategy[str]:
    """File names a user could pass to ``build_store`` (no NUL, not empty)."""
    part = st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00/"),
        min_size=1,
        max_size=12,
    )
    return st.lists(part, min_size=1, max_size=4).map("/".join)
