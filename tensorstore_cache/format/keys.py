"""How a source path becomes a key, and how keys are hashed.

A key is ``posixpath.normpath(os.fspath(path))``: the path as the caller wrote
it, with redundant separators and ``.`` components removed. Relative paths are
*not* resolved against the working directory, so the same relative path names
the same entry on every machine. A key is stored as its UTF-8 bytes (with
``surrogateescape`` for undecodable file names) and hashed with XXH3-64
(seed 0), which is stable across processes, machines and Python versions.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Union

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = [
    "KeyLayout",
    "PathLike",
    "encode_as_given",
    "encode_key",
    "encode_keys",
    "encode_keys_laid_out",
    "hash_encoded",
    "hash_key",
    "key_layout",
    "normalize_key",
    "normalize_keys",
    "path_sequence",
]

PathLike = Union[str, "os.PathLike[str]"]


def normalize_key(path: object) -> str:
    """Return the key of one source path.

    Parameters
    ----------
    path
        A ``str`` or ``os.PathLike``.

    Returns
    -------
    str
        The normalised key.

    Raises
    ------
    TypeError
        If ``path`` is not a string or path-like object.
    ValueError
        If ``path`` is empty or contains a NUL character.

    Examples
    --------
    >>> normalize_key("data//images/./0001.jpg")
    'data/images/0001.jpg'
    """
    if type(path) is str:
        raw = path
        # fast path: a path normpath would leave unchanged
        if raw and "//" not in raw and "/." not in raw and raw[0] != "." and raw[-1] != "/" and "\x00" not in raw:
            return raw
    else:
        try:
            fs = os.fspath(path)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(
                f"a path must be a str or os.PathLike, got {type(path).__name__}: {path!r}"
            ) from None
        raw = os.fsdecode(fs) if isinstance(fs, bytes) else fs
    if not raw:
        raise ValueError("a path must not be empty")
    if "\x00" in raw:
        raise ValueError(f"a path must not contain NUL characters: {raw!r}")
    return posixpath.normpath(raw)


def normalize_keys(paths: Iterable[object]) -> list[str]:
    """Normalise every path of an iterable (a list, a pandas Series, ...).

    Parameters
    ----------
    paths
        Any iterable of ``str`` or ``os.PathLike``.

    Returns
    -------
    list of str
        The keys, in input order, duplicates kept.
    """
    values = path_sequence(paths)
    if isinstance(values, np.ndarray):
        values = values.tolist()  # numpy str_ items become str
    if _all_keys(values):
        return list(values)
    return [normalize_key(p) for p in values]


def _all_keys(paths: Sequence[Any]) -> bool:
    """Whether every path of ``paths`` is a ``str`` that already is its own key.

    One join and a few vectorised passes (:func:`_plain`) instead of a call of
    :func:`normalize_key` per path; False sends the caller key by key.
    """
    if len(paths) == 0 or set(map(type, paths)) != {str}:  # keys are plain str
        return False
    joined = _joined(paths)
    # a path holding a NUL would add a separator: normalize_key must reject it
    return joined is not None and _plain(joined) and joined.count(b"\x00") == len(paths) - 1


def _joined(paths: Sequence[Any] | npt.NDArray[Any]) -> bytes | None:
    """The UTF-8 bytes of ``paths`` joined by NUL; None if one is not a ``str``."""
    try:
        return "\x00".join(paths).encode("utf-8", "surrogateescape")
    except (TypeError, UnicodeEncodeError):  # not all str (os.PathLike...)
        return None


def path_sequence(paths: Iterable[object]) -> Sequence[Any]:
    """Return the paths of an iterable as a sequence (a pandas Series as its array).

    Raises
    ------
    TypeError
        If ``paths`` is one path (a ``str``, ``bytes`` or ``os.PathLike``)
        rather than an iterable of them.
    """
    values: Any = getattr(paths, "values", paths)  # a pandas Series -> its ndarray
    if isinstance(values, (str, bytes, os.PathLike)):
        raise TypeError(
            f"paths must be an iterable of paths, not a single path: {values!r}; "
            "wrap it in a list"
        )
    if not isinstance(values, (list, tuple, np.ndarray)):
        # A pandas extension array (pandas 3 stores strings in Arrow) yields its items
        # one Python call each when iterated; its tolist() converts them in one pass.
        tolist = getattr(values, "tolist", None)
        converted = tolist() if callable(tolist) else None
        values = converted if isinstance(converted, list) else list(values)
    return values  # type: ignore[no-any-return]


def encode_key(key: str) -> bytes:
    """Return the stored bytes of a normalised key."""
    return key.encode("utf-8", "surrogateescape")


_SLASH, _DOT = ord("/"), ord(".")


#: Bytes of joined keys checked per vectorised step of :func:`_plain`: its temporaries
#: (a few bytes per byte) stay well below glibc's initial mmap threshold (128 KiB), so they
#: are reused from the heap instead of raising the threshold and growing the heap for good.
_PLAIN_BLOCK = 16 << 10


def _plain(joined: bytes) -> bool:
    """Whether every key in ``joined`` (encoded keys separated by NUL) is its own key.

    The conditions of :func:`normalize_key`'s fast path, checked for a whole
    chunk with a few vectorised comparisons of each byte with the next one
    instead of a call per path: no key is empty, starts with ``.``, ends with
    ``/``, or holds ``//`` or ``/.``. (The encoding of any other character has
    no byte below 0x80.) It works in blocks of :data:`_PLAIN_BLOCK` bytes.
    """
    if not joined or joined[0] in (0, _DOT) or joined[-1] in (0, _SLASH):
        return False
    data = np.frombuffer(joined, dtype=np.uint8)
    last = len(data) - 1  # pairs (data[i], data[i + 1]) for i < last
    for start in range(0, last, _PLAIN_BLOCK):
        first = data[start : min(start + _PLAIN_BLOCK, last)]
        then = data[start + 1 : start + 1 + len(first)]
        slash = first == _SLASH
        # a pair "/" + one of "/", "." or NUL: "//", "/.", a key ending with "/"
        bad = slash & (((then | 1) == _SLASH) | (then == 0))
        # NUL + "." or NUL: a key starting with ".", an empty key
        bad |= (first == 0) & ((then == _DOT) | (then == 0))
        if bad.any():
            return False
    return True


class KeyLayout(NamedTuple):
    """Where encoded keys lie in one buffer, for comparing them all at once.

    Key ``i`` is ``joined[starts[i] : starts[i] + lengths[i]]``; the spans are
    in order but need not be adjacent (:meth:`take` keeps the buffer).
    """

    joined: bytes
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]

    def take(self, index: npt.NDArray[np.intp]) -> KeyLayout:
        """The layout of the keys at ``index``, in that order (same buffer)."""
        return KeyLayout(self.joined, self.starts[index], self.lengths[index])


def key_layout(encoded: Sequence[bytes]) -> KeyLayout:
    """Return the layout of separately encoded keys (joined into one buffer)."""
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    starts = np.zeros(len(encoded), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return KeyLayout(b"".join(encoded), starts, lengths)


def _separators(joined: bytes) -> npt.NDArray[np.int64]:
    """The positions of the NULs of ``joined``."""
    return np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == 0)


def _split_layout(joined: bytes, seps: npt.NDArray[np.int64]) -> KeyLayout:
    """The layout of the keys of ``joined``, separated by NULs at ``seps``."""
    count = len(seps) + 1
    starts = np.empty(count, dtype=np.int64)
    starts[0] = 0
    np.add(seps, 1, out=starts[1:])
    lengths = np.empty(count, dtype=np.int64)
    np.subtract(seps, starts[:-1], out=lengths[:-1])
    lengths[-1] = len(joined) - starts[-1]
    return KeyLayout(joined, starts, lengths)


def encode_as_given(
    paths: Sequence[Any] | npt.NDArray[Any],
) -> tuple[list[bytes], KeyLayout] | None:
    """Encode ``str`` paths as they are, without normalising them, for a lookup.

    A stored key is its own key (:func:`normalize_key` leaves it as it is), so
    a path whose bytes are a stored key's names that key; a lookup by
    these bytes then normalises only the paths it did not find. For a chunk of
    paths: its temporaries grow with their bytes.

    Returns
    -------
    tuple of (list of bytes, KeyLayout) or None
        Each path's bytes and their layout; None when a path is not a ``str``
        or holds a NUL (:func:`encode_keys_laid_out` then says which).
    """
    joined = _joined(paths) if len(paths) else None
    if joined is None:
        return None
    seps = _separators(joined)
    if len(seps) != len(paths) - 1:  # a path holds a NUL
        return None
    return joined.split(b"\x00"), _split_layout(joined, seps)


def encode_keys_laid_out(
    paths: Sequence[Any] | npt.NDArray[Any],
) -> tuple[Sequence[str], list[bytes], KeyLayout]:
    """:func:`encode_keys`, with the layout of the encoded keys in one buffer.

    For a chunk of paths: its temporaries grow with their bytes.

    Returns
    -------
    keys : sequence of str
        The normalised keys (``paths`` itself when every path already is one).
    encoded : list of bytes
        Their stored bytes, in order.
    layout : KeyLayout
        The same bytes, joined.
    """
    if len(paths) == 0:
        return [], [], KeyLayout(b"", np.empty(0, np.int64), np.empty(0, np.int64))
    joined = _joined(paths)
    keys: Sequence[str] = paths  # type: ignore[assignment]
    # every path its own key (the checks of normalize_key's fast path), none holding a NUL
    seps = _separators(joined) if joined is not None and _plain(joined) else None
    if joined is None or seps is None or len(seps) != len(paths) - 1:
        keys = [normalize_key(p) for p in paths]  # raises for a bad path
        joined = "\x00".join(keys).encode("utf-8", "surrogateescape")
        seps = _separators(joined)
    return keys, joined.split(b"\x00"), _split_layout(joined, seps)


def encode_keys(paths: Sequence[Any] | npt.NDArray[Any]) -> tuple[Sequence[str], list[bytes]]:
    """Normalise and encode many paths at once (the bulk form of :func:`normalize_key` and
    :func:`encode_key`).

    Parameters
    ----------
    paths
        ``str`` or ``os.PathLike`` values (a list, a tuple, an ndarray).

    Returns
    -------
    keys : sequence of str
        The normalised keys (``paths`` itself when every path already is one).
    encoded : list of bytes
        Their stored bytes, in order.

    Raises
    ------
    TypeError, ValueError
        As :func:`normalize_key`, for the first bad path.
    """
    keys, encoded, _ = encode_keys_laid_out(paths)
    return keys, encoded


hash_key: Callable[[bytes], int] = xxhash.xxh3_64_intdigest
"""XXH3-64 of one encoded key, as a Python int (the function itself: no wrapper call)."""


def hash_encoded(encoded: Sequence[bytes]) -> npt.NDArray[np.uint64]:
    """Hash encoded keys with XXH3-64.

    Parameters
    ----------
    encoded
        Keys as returned by :func:`encode_key`.

    Returns
    -------
    numpy.ndarray
        ``uint64`` hashes, one per key.
    """
    return np.fromiter(map(hash_key, encoded), dtype=np.uint64, count=len(encoded))
