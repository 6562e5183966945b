"""The on-disk format: what every byte of a store means, read and written through :mod:`~tensorstore_cache.fs`.

The layers above import only the names listed here (``from ..format import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .fields import (
        FIELDS,
        Field,
        FieldLayout,
        Fixed,
        Ragged,
        Text,
        check_name,
        chunk_rows,
        schema_from_json,
        schema_to_json,
    )
    from .hashes import HASH_SUFFIX, hashes_path, read_hashes, write_hashes
    from .keys import (
        KeyLayout,
        encode_as_given,
        encode_key,
        encode_keys_laid_out,
        hash_encoded,
        hash_key,
        key_layout,
        normalize_key,
        normalize_keys,
        path_sequence,
    )
    from .metadata import (
        GROUP,
        INDEX_ARRAYS,
        VECTORS,
        GroupMetadata,
        array_documents,
        fetched_dirs,
        fetched_files,
        first_file_ids,
        index_array_length,
        index_array_metadata,
        shard_key,
    )
    from .shard import MappedShard, map_shard_fd, open_shard, write_shard
    from .spec import FORMAT_VERSION, RECORDS_VERSION, StoreSpec, canonical_json
    from .verify import Problem, VerifyReport, verify_segment, verify_segments

#: Every name of the interface, by the module defining it.
_MODULES = {
    "fields": ("FIELDS", "Field", "FieldLayout", "Fixed", "Ragged", "Text", "check_name", "chunk_rows", "schema_from_json", "schema_to_json",),
    "hashes": ("HASH_SUFFIX", "hashes_path", "read_hashes", "write_hashes",),
    "keys": ("KeyLayout", "encode_as_given", "encode_key", "encode_keys_laid_out", "hash_encoded", "hash_key", "key_layout", "normalize_key", "normalize_keys", "path_sequence",),
    "metadata": ("GROUP", "INDEX_ARRAYS", "VECTORS", "GroupMetadata", "array_documents", "fetched_dirs", "fetched_files", "first_file_ids", "index_array_length", "index_array_metadata", "shard_key",),
    "shard": ("MappedShard", "map_shard_fd", "open_shard", "write_shard",),
    "spec": ("FORMAT_VERSION", "RECORDS_VERSION", "StoreSpec", "canonical_json",),
    "verify": ("Problem", "VerifyReport", "verify_segment", "verify_segments",),
}

__all__ = [
    "FIELDS",
    "FORMAT_VERSION",
    "Field",
    "FieldLayout",
    "Fixed",
    "GROUP",
    "GroupMetadata",
    "HASH_SUFFIX",
    "INDEX_ARRAYS",
    "KeyLayout",
    "MappedShard",
    "Problem",
    "RECORDS_VERSION",
    "Ragged",
    "StoreSpec",
    "Text",
    "VECTORS",
    "VerifyReport",
    "array_documents",
    "canonical_json",
    "check_name",
    "chunk_rows",
    "encode_as_given",
    "encode_key",
    "encode_keys_laid_out",
    "fetched_dirs",
    "fetched_files",
    "first_file_ids",
    "hash_encoded",
    "hash_key",
    "hashes_path",
    "index_array_length",
    "index_array_metadata",
    "key_layout",
    "map_shard_fd",
    "normalize_key",
    "normalize_keys",
    "open_shard",
    "path_sequence",
    "read_hashes",
    "schema_from_json",
    "schema_to_json",
    "shard_key",
    "verify_segment",
    "verify_segments",
    "write_hashes",
    "write_shard",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
