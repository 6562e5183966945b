"""Remote transport and the node cache: stores at fsspec URLs (and on network filesystems).

Nothing here opens or builds a store: :func:`~tensorstore_cache.remote.fetch.fetch_store`
puts a version's metadata and index into the node cache,
:class:`~tensorstore_cache.remote.shards.NodeShards` fetches its shards on demand
under the cap of :mod:`~tensorstore_cache.remote.node_cache`, and
:mod:`~tensorstore_cache.remote.upload` sends a store (shard by shard from a build's
tasks, the group ``zarr.json`` last). Opening and building are routed in
:mod:`tensorstore_cache._api` and :mod:`tensorstore_cache.writer.builder`.

The layers above import only the names listed here (``from ..remote import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .bundle import BUNDLE_SUFFIX, Bundle
    from .copy import RemoteStore, version_source
    from .documents import REMOTE_VERSION, check_document, document
    from .fetch import adopt_version, install_bundle
    from .lease import Lease, LeaseTimes, acquire, monotonic, stage
    from .manifests import (
        PartRef,
        RemoteManifest,
        RemoteNamespace,
        check_conditional,
        parse_manifest,
    )
    from .node_cache import NodeCache, Removed, collect, requested_cap
    from .objects import DirectoryObjects, S3Objects, WriteDeniedError, objects_at
    from .survey import RemoteCacheInfo, collect_remote, survey_prefix
    from .upload import (
        check_target,
        discard_files,
        discard_upload,
        download_files,
        shared_between_processes,
        staging_dir,
        upload_file,
        upload_store,
        withdraw_store,
    )
    from .urls import (
        file_url_path,
        is_url,
        node_dir,
        open_url_dir,
        redact,
        reduce_public,
        remote_cache_root,
        shared_scheme,
        url_dir,
    )

#: Every name of the interface, by the module defining it.
_MODULES = {
    "bundle": ("BUNDLE_SUFFIX", "Bundle"),
    "copy": ("RemoteStore", "version_source"),
    "documents": ("REMOTE_VERSION", "check_document", "document"),
    "fetch": ("adopt_version", "install_bundle"),
    "lease": ("Lease", "LeaseTimes", "acquire", "monotonic", "stage"),
    "manifests": ("PartRef", "RemoteManifest", "RemoteNamespace", "check_conditional",
                  "parse_manifest"),
    "objects": ("DirectoryObjects", "S3Objects", "WriteDeniedError", "objects_at"),
    "node_cache": ("NodeCache", "Removed", "collect", "requested_cap"),
    "upload": ("check_target", "discard_files", "discard_upload", "download_files", "shared_between_processes", "staging_dir", "upload_file", "upload_store", "withdraw_store"),
    "survey": ("RemoteCacheInfo", "collect_remote", "survey_prefix"),
    "urls": ("file_url_path", "is_url", "node_dir", "open_url_dir", "redact", "reduce_public",
             "remote_cache_root", "shared_scheme", "url_dir"),
}

__all__ = [
    "BUNDLE_SUFFIX",
    "Bundle",
    "DirectoryObjects",
    "Lease",
    "LeaseTimes",
    "NodeCache",
    "PartRef",
    "REMOTE_VERSION",
    "RemoteCacheInfo",
    "RemoteManifest",
    "RemoteNamespace",
    "RemoteStore",
    "Removed",
    "S3Objects",
    "WriteDeniedError",
    "acquire",
    "adopt_version",
    "check_conditional",
    "check_document",
    "check_target",
    "collect",
    "collect_remote",
    "discard_files",
    "discard_upload",
    "document",
    "download_files",
    "file_url_path",
    "install_bundle",
    "is_url",
    "monotonic",
    "node_dir",
    "objects_at",
    "open_url_dir",
    "parse_manifest",
    "redact",
    "reduce_public",
    "remote_cache_root",
    "requested_cap",
    "shared_between_processes",
    "shared_scheme",
    "stage",
    "staging_dir",
    "survey_prefix",
    "upload_file",
    "upload_store",
    "url_dir",
    "version_source",
    "withdraw_store",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
