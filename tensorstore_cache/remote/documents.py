"""The kinds and the version of the objects of a remote namespace.

Every JSON object the cluster protocol writes (manifests, the head hint,
leases, the store probe) holds ``kind`` (what it is) and ``version`` (the
remote layout's version, :data:`REMOTE_VERSION`); a part's bundle carries the
same two in its header. A reader refuses an object of another kind, and one
of a version it does not know (written by a newer release), with an error
naming the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..errors import CorruptStoreError

__all__ = ["Kind", "REMOTE_VERSION", "check_document", "document", "kind_name"]

#: The version of the remote namespace's layout and objects this release writes and reads.
REMOTE_VERSION = 1

#: The kinds of remote objects.
Kind = Literal["manifest", "head", "lease", "probe", "bundle"]


def kind_name(kind: Kind) -> str:
    """The value of ``kind`` in an object of that kind (``"tensorstore_cache.remote.<kind>"``)."""
    return f"tensorstore_cache.remote.{kind}"


def document(kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as an object of ``kind``: with its ``kind`` and ``version``."""
    return {"kind": kind_name(kind), "version": REMOTE_VERSION, **body}


def check_document(doc: Mapping[str, Any], kind: Kind, where: str) -> None:
    """Check that ``doc``, read at ``where``, is an object of ``kind`` this release reads.

    Raises
    ------
    CorruptStoreError
        If it is of another kind, or of a version this release does not read
        (the message says to upgrade).
    """
    if doc.get("kind") != kind_name(kind):
        raise CorruptStoreError(
            f"{where!r} is not a {kind} of a remote cache namespace (its kind is "
            f"{doc.get('kind')!r}, not {kind_name(kind)!r}); it was damaged or written by "
            "something else: remove the namespace's prefix", where)
    version = doc.get("version")
    if type(version) is not int or version != REMOTE_VERSION:
        raise CorruptStoreError(
            f"{where!r} is a {kind} of version {version!r}; this release reads version "
            f"{REMOTE_VERSION} of remote namespaces: upgrade tensorstore_cache (every machine "
            "sharing the prefix must run a release that reads it)", where)
