"""The on-disk layout: names, array metadata, and the group metadata, read and written.

A store is a zarr v3 group. This module builds the exact ``zarr.json``
documents the writer emits and checks, before anything is mapped, that a
store's metadata is one of those documents (an allowlist: any other dtype,
codec, chunking or attribute is rejected). :class:`GroupMetadata` is the one
description of a store's group document: parsed by readers, written by
builds and merges.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..fs.durable import fsync_dir, write_json_durable
from ..fs.safe import read_json
from .spec import FORMAT_VERSION, StoreSpec

__all__ = [
    "ATTR_KEY",
    "DTYPES",
    "GROUP",
    "INDEX_ARRAYS",
    "VECTORS",
    "GroupMetadata",
    "expected_files",
    "index_array_length",
    "index_array_metadata",
    "shard_count",
    "shard_key",
    "vectors_metadata",
]

#: Group attribute that holds the store's description.
ATTR_KEY = "tensorstore_cache"
#: The group metadata file (written last: it is the store's commit record).
GROUP = "zarr.json"
#: Name of the array of vectors.
VECTORS = "vectors"
#: One-dimensional index arrays: name -> (dtype, length is n or n + 1 or bytes).
INDEX_ARRAYS: dict[str, str] = {
    "key_hash": "uint64",  # XXH3-64 of every key, ascending
    "key_row": "int64",  # row of the key at the same position of key_hash
    "key_offsets": "uint64",  # n + 1 offsets into key_bytes, in row order
    "key_bytes": "uint8",  # UTF-8 keys, concatenated in row order
    "source_size": "int64",  # st_size of each source at build time, -1 if unknown
    "source_mtime_ns": "int64",  # st_mtime_ns of each source at build time, -1 if unknown
}
#: Element types a store may hold (zarr v3 names, always little-endian).
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
_MAX_N = 1 << 40
_MAX_ITEM_BYTES = 1 << 31
_MAX_DIMS = 8
_HEX128 = re.compile(r"[0-9a-f]{32}")


def _fill(dtype: str) -> Any:
    if dtype == "bool":
        return False
    return 0.0 if dtype.startswith("float") else 0


def _bytes_codec() -> dict[str, Any]:
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _array(shape: list[int], chunk: list[int], dtype: str, codecs: list[Any]) -> dict[str, Any]:
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill(dtype),
        "codecs": codecs,
        "attributes": {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def vectors_metadata(spec: StoreSpec) -> dict[str, Any]:
    """Return the ``zarr.json`` of the ``vectors`` array of ``spec``."""
    item = list(spec.item_shape)
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [1, *item],
            "codecs": [_bytes_codec()],
            "index_codecs": [_bytes_codec(), {"name": "crc32c"}],
            "index_location": "end",
        },
    }
    return _array([spec.n, *item], [spec.rows_per_shard, *item], spec.dtype, [sharding])


def index_array_length(name: str, spec: StoreSpec, key_bytes_len: int) -> int:
    """Return the length of index array ``name``."""
    if name == "key_offsets":
        return spec.n + 1
    if name == "key_bytes":
        return key_bytes_len
    return spec.n


def index_array_metadata(name: str, length: int) -> dict[str, Any]:
    """Return the ``zarr.json`` of a one-dimensional, single-chunk index array."""
    return _array([length], [max(length, 1)], INDEX_ARRAYS[name], [_bytes_codec()])


def shard_count(spec: StoreSpec) -> int:
    """Return the number of shard files of ``spec``'s vectors."""
    return math.ceil(spec.n / spec.rows_per_shard)


def shard_key(spec: StoreSpec, k: int) -> str:
    """Return the store-relative path of shard ``k``."""
    return posixpath.join(VECTORS, "c", str(k), *(["0"] * len(spec.item_shape)))


def expected_files(spec: StoreSpec, key_bytes_len: int) -> set[str]:
    """Return every file a store of ``spec`` consists of, except the group ``zarr.json``."""
    files = {f"{VECTORS}/zarr.json"}
    files.update(shard_key(spec, k) for k in range(shard_count(spec)))
    for name in INDEX_ARRAYS:
        files.add(f"{name}/zarr.json")
        if index_array_length(name, spec, key_bytes_len) > 0:
            files.add(f"{name}/c/0")
    return files


def _int(value: Any, what: str, lo: int, hi: int, where: str) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise CorruptStoreError(
            f"{where}: {what} must be an integer in [{lo}, {hi}], got {value!r}", where
        )
    return value


def _spec_from_attrs(attrs: Any, where: str) -> tuple[StoreSpec, dict[str, tuple[int, str]], int]:
    if not isinstance(attrs, dict):
        raise CorruptStoreError(f"{where}: attribute {ATTR_KEY!r} must be an object", where)
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise CorruptStoreError(
            f"{where}: format version {version!r} is not supported by this release "
            f"(it reads version {FORMAT_VERSION}); upgrade tensorstore_cache or rebuild the store",
            where,
        )
    n = _int(attrs.get("n"), "n", 0, _MAX_N, where)
    shape = attrs.get("item_shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= _MAX_DIMS:
        raise CorruptStoreError(f"{where}: item_shape must be a list of 1 to 8 sizes", where)
    item_shape = tuple(_int(d, "an item_shape size", 1, _MAX_ITEM_BYTES, where) for d in shape)
    dtype = attrs.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CorruptStoreError(
            f"{where}: dtype {dtype!r} is not allowed; allowed: {sorted(DTYPES)}", where
        )
    itemsize = np.dtype(dtype).itemsize
    if math.prod(item_shape) * itemsize > _MAX_ITEM_BYTES:
        raise CorruptStoreError(f"{where}: item_shape {list(item_shape)} is too large", where)
    loader_id = attrs.get("loader_id")
    if not isinstance(loader_id, str) or len(loader_id) > 1000:
        raise CorruptStoreError(f"{where}: loader_id must be a short string", where)
    params = attrs.get("loader_params")
    if not isinstance(params, dict):
        raise CorruptStoreError(f"{where}: loader_params must be an object", where)
    rows = _int(attrs.get("rows_per_shard"), "rows_per_shard", 1, _MAX_N, where)
    if rows * math.prod(item_shape) * itemsize > (1 << 40):
        raise CorruptStoreError(f"{where}: shards of {rows} rows are too large", where)
    skipped_raw = attrs.get("skipped", [])
    if not isinstance(skipped_raw, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)
        for s in skipped_raw
    ):
        raise CorruptStoreError(f"{where}: skipped must be a list of [path, reason]", where)
    created = attrs.get("created_unix", 0.0)
    if not isinstance(created, (int, float)):
        raise CorruptStoreError(f"{where}: created_unix must be a number", where)
    key_bytes_len = _int(attrs.get("key_bytes_len"), "key_bytes_len", 0, 1 << 48, where)
    spec = StoreSpec(
        n=n,
        item_shape=item_shape,
        dtype=dtype,
        loader_id=loader_id,
        loader_params=params,
        format_version=version,
        rows_per_shard=rows,
        skipped=tuple((s[0], s[1]) for s in skipped_raw),
        created_unix=float(created),
    )
    files_raw = attrs.get("files")
    if not isinstance(files_raw, dict):
        raise CorruptStoreError(f"{where}: files must be an object", where)
    count = 1 + shard_count(spec) + sum(  # counted before listing them: n may be hostile
        1 + (index_array_length(name, spec, key_bytes_len) > 0) for name in INDEX_ARRAYS
    )
    if len(files_raw) != count:
        raise CorruptStoreError(
            f"{where}: the file list has {len(files_raw)} entries but a store of {n} rows in "
            f"shards of {rows} needs {count}; the metadata is damaged",
            where,
        )
    expected = expected_files(spec, key_bytes_len)
    if set(files_raw) != expected:
        odd = sorted(set(files_raw) ^ expected)[:3]
        raise CorruptStoreError(
            f"{where}: the file list does not match the store's shape (e.g. {odd}); "
            "the metadata is damaged",
            where,
        )
    files: dict[str, tuple[int, str]] = {}
    for rel, entry in files_raw.items():
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or type(entry[0]) is not int
            or entry[0] < 0
            or not isinstance(entry[1], str)
            or not _HEX128.fullmatch(entry[1])
        ):
            raise CorruptStoreError(
                f"{where}: file entry for {rel!r} must be [size, xxh3-128 hex]", where
            )
        files[rel] = (entry[0], entry[1])
    return spec, files, key_bytes_len


def _exists(root: Path, name: str, root_fd: int | None) -> bool:
    try:
        if root_fd is None:
            os.lstat(root / name)
        else:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A store's group ``zarr.json``: its spec and the size and checksum of every file.

    Examples
    --------
    >>> meta = GroupMetadata.read(Path("covers.tsc"))  # doctest: +SKIP
    >>> meta.spec.n, len(meta.files)                    # doctest: +SKIP
    (10000, 23)
    """

    spec: StoreSpec
    """What the store holds."""
    files: dict[str, tuple[int, str]]
    """Store-relative path -> ``(size, xxh3-128 hex)`` of every file but the group ``zarr.json``."""
    key_bytes_len: int
    """Length of the ``key_bytes`` index array."""

    @classmethod
    def from_json(cls, group: Any, where: str) -> GroupMetadata:
        """Validate a decoded group document; ``where`` names it in errors.

        Raises
        ------
        CorruptStoreError
            If it differs in anything from what this format allows.
        """
        if not isinstance(group, dict) or group.get("zarr_format") != 3 or group.get(
            "node_type"
        ) != "group":
            raise CorruptStoreError(f"{where} is not a zarr v3 group", where)
        attributes = group.get("attributes")
        if not isinstance(attributes, dict) or ATTR_KEY not in attributes:
            raise CorruptStoreError(
                f"{where} is a zarr group but not a tensorstore_cache store "
                f"(no {ATTR_KEY!r} attribute)",
                where,
            )
        return cls(*_spec_from_attrs(attributes[ATTR_KEY], where))

    def to_json(self) -> dict[str, Any]:
        """Return the group document (as written to ``zarr.json``)."""
        attrs = self.spec.to_json()
        attrs["key_bytes_len"] = self.key_bytes_len
        attrs["key_hash"] = "xxh3_64"
        attrs["checksum"] = "xxh3_128"
        attrs["files"] = {rel: [size, digest] for rel, (size, digest) in sorted(self.files.items())}
        return {"attributes": {ATTR_KEY: attrs}, "zarr_format": 3, "node_type": "group"}

    def array_documents(self) -> dict[str, dict[str, Any]]:
        """Return the ``zarr.json`` of every array of the store, by array name."""
        docs = {VECTORS: vectors_metadata(self.spec)}
        for name in INDEX_ARRAYS:
            docs[name] = index_array_metadata(
                name, index_array_length(name, self.spec, self.key_bytes_len)
            )
        return docs

    @classmethod
    def read(cls, root: Path, root_fd: int | None = None) -> GroupMetadata:
        """Read and validate every metadata file of the store at ``root``.

        ``root_fd``, a descriptor of ``root``, makes every file be read from that
        directory even if another one is renamed to ``root`` meanwhile.

        Raises
        ------
        StoreNotFoundError
            If ``root`` has no ``zarr.json``.
        CorruptStoreError
            If any metadata differs from what this format allows.
        """
        where = str(root / GROUP)
        try:
            if root_fd is None:
                group = read_json(root / GROUP, max_bytes=config.MAX_GROUP_JSON)
            else:
                try:
                    os.stat(GROUP, dir_fd=root_fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise StoreNotFoundError(f"{where} does not exist") from None
                group = read_json(root / GROUP, max_bytes=config.MAX_GROUP_JSON, root=root,
                                  root_fd=root_fd)
        except StoreNotFoundError:
            if _exists(root, VECTORS, root_fd):
                raise CorruptStoreError(
                    f"{where} is missing but {root} holds store data; the store's metadata was "
                    "deleted - rebuild the store",
                    where,
                ) from None
            raise
        meta = cls.from_json(group, where)
        for name, expected in meta.array_documents().items():
            path = root / name / GROUP
            found = read_json(path, max_bytes=config.MAX_ARRAY_JSON, root=root, root_fd=root_fd)
            if found != expected:
                raise CorruptStoreError(
                    f"{path} does not describe the array this store needs (dtype, shape, "
                    "chunking and codecs must be exactly those written by tensorstore_cache)",
                    str(path),
                )
        return meta

    def write(self, root: Path) -> None:
        """Write the group ``zarr.json`` into ``root`` durably (it must not exist yet)."""
        write_json_durable(root / GROUP, self.to_json())
        fsync_dir(root)
