"""A loader's resumable state: its JSON document, the digest of the row order, the checks.

The state is small and JSON-serialisable::

    {"version": 1, "seed": 0, "epoch": 3, "consumed": 120, "n": 181777,
     "global_batch": 256, "shuffle": true, "drop_last": true,
     "digest": "xxh3_64:0f1e2d3c4b5a6978"}

``consumed`` counts the global steps of ``epoch`` handed to the training loop.
Resuming is O(1): the epoch's permutation is recomputed and sliced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xxhash

__all__ = ["LoaderState", "OnChange", "STATE_VERSION", "order_digest"]

STATE_VERSION = 1
OnChange = Literal["raise", "restart_epoch"]
_DIGEST_PREFIX = "xxh3_64:"
_CHUNK = 65536
_FIELDS = ("version", "seed", "epoch", "consumed", "n", "global_batch", "digest")


def order_digest(keys: Iterable[str], n: int) -> str:
    """XXH3-64 of the keys in order plus their number, as ``"xxh3_64:<16 hex digits>"``.

    The digest is XXH3-64 (seed 0) of ``n`` (8 bytes, little-endian), then the
    XXH3-64 of every key's UTF-8 length (4 bytes little-endian each, in order),
    then the XXH3-64 of all the keys' UTF-8 bytes concatenated: it changes when
    a key is added, removed, renamed or moved, and not when the same keys are
    stored again (a store compacted or rebuilt).

    Parameters
    ----------
    keys
        The dataset's keys (paths), in item order.
    n
        The number of items.

    Returns
    -------
    str
        ``"xxh3_64:"`` followed by 16 hexadecimal digits.

    Examples
    --------
    >>> order_digest(["a.jpg", "b.jpg"], 2) == order_digest(["a.jpg", "b.jpg"], 2)
    True
    >>> order_digest(["a.jpg", "b.jpg"], 2) == order_digest(["b.jpg", "a.jpg"], 2)
    False
    >>> order_digest(["ab", "c"], 2) == order_digest(["a", "bc"], 2)
    False
    """
    lengths, data = xxhash.xxh3_64(), xxhash.xxh3_64()
    chunk: list[bytes] = []
    count = 0

    def flush() -> None:
        lengths.update(np.fromiter(map(len, chunk), dtype="<u4", count=len(chunk)).tobytes())
        data.update(b"".join(chunk))
        chunk.clear()

    for key in keys:
        chunk.append(key.encode("utf-8", "surrogateescape"))
        count += 1
        if len(chunk) == _CHUNK:
            flush()
    flush()
    if count != n:
        raise ValueError(f"order_digest: got {count} keys for n={n}")
    whole = xxhash.xxh3_64(int(n).to_bytes(8, "little"))
    whole.update(lengths.digest())
    whole.update(data.digest())
    return _DIGEST_PREFIX + whole.hexdigest()


def _int_field(state: Mapping[str, Any], name: str, low: int = 0) -> int:
    value = state[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"loader state: {name} must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class LoaderState:
    """A parsed, checked loader state (see the module docstring for its document)."""

    seed: int
    """Seed of the order and of the batch transforms."""
    epoch: int
    """Epoch of the next batch."""
    consumed: int
    """Global steps of ``epoch`` already handed to the training loop."""
    n: int
    """Number of items when the state was saved."""
    global_batch: int
    """Items per global step."""
    digest: str
    """:func:`order_digest` of the items' keys."""
    shuffle: bool | None = None
    """Whether the order was shuffled (``None``: not recorded)."""
    drop_last: bool | None = None
    """Whether each epoch's tail was dropped (``None``: not recorded)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-serialisable document (what ``state_dict()`` returns)."""
        out: dict[str, Any] = {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "n": self.n,
            "global_batch": self.global_batch,
            "digest": self.digest,
        }
        if self.shuffle is not None:
            out["shuffle"] = self.shuffle
        if self.drop_last is not None:
            out["drop_last"] = self.drop_last
        return out

    @classmethod
    def from_dict(cls, state: Any) -> LoaderState:
        """Parse and check a document from ``state_dict()`` (e.g. read back from JSON).

        Raises
        ------
        TypeError
            If ``state`` is not a mapping.
        ValueError
            If a field is missing, of the wrong type, or of an unknown version.
        """
        if not isinstance(state, Mapping):
            raise TypeError(
                f"load_state_dict() expects the dict returned by state_dict(), got "
                f"{type(state).__name__}"
            )
        missing = [f for f in _FIELDS if f not in state]
        if missing:
            raise ValueError(
                f"loader state: missing {', '.join(missing)} (fields of a state: "
                f"{', '.join(_FIELDS)}); pass what loader.state_dict() returned"
            )
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"loader state: version {state['version']!r} is not supported (this version of "
                f"tensorstore_cache reads version {STATE_VERSION})"
            )
        digest = state["digest"]
        if not isinstance(digest, str) or not digest.startswith(_DIGEST_PREFIX):
            raise ValueError(f"loader state: digest must be a string '{_DIGEST_PREFIX}...', got {digest!r}")
        flags: dict[str, bool | None] = {}
        for name in ("shuffle", "drop_last"):
            value = state.get(name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"loader state: {name} must be true or false, got {value!r}")
            flags[name] = value
        return cls(
            seed=_int_field(state, "seed"),
            epoch=_int_field(state, "epoch"),
            consumed=_int_field(state, "consumed"),
            n=_int_field(state, "n"),
            global_batch=_int_field(state, "global_batch", 1),
            digest=digest,
            shuffle=flags["shuffle"],
            drop_last=flags["drop_last"],
        )
