"""Create-only objects: the one primitive a commit shared by several machines needs.

A :class:`Objects` is a flat set of named objects under one remote prefix
with five operations: :meth:`~Objects.create` (only if the name is free),
:meth:`~Objects.read`, :meth:`~Objects.write` (overwrite, for hints and a
lease's heartbeat), and whole-file :meth:`~Objects.put_file` /
:meth:`~Objects.get_file`. Two implementations:

- :class:`S3Objects`: any fsspec filesystem whose ``pipe_file`` takes
  ``mode="create"`` (s3fs sends ``If-None-Match: *``, answered 412 when the
  name is taken; a MinIO that answers 304 means the same).
- :class:`DirectoryObjects`: a directory on a filesystem every machine
  mounts (NFS, Lustre, ...): a create is a hard :func:`os.link` of a
  complete temporary file, which fails when the name exists; no ``flock``.

A create's body carries its writer's token. When a create fails because the
name is taken, or fails in a way that may hide a success (a lost response, a
409, a timeout that the client retried into a false "exists"), the object is
read back: our token means the create landed. So :meth:`Objects.create`
answers exactly "did my write become the object".

Errors that clear on their own (503 ``SlowDown``, 409 ``ConditionalRequestConflict``,
timeouts, a reset connection) are retried with jittered backoff a bounded
number of times, then raised.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UnsafeRemoteError
from .urls import file_url_path, filesystem, is_url, redact, shared_scheme

__all__ = [
    "DirectoryObjects",
    "ObjectInfo",
    "Objects",
    "S3Objects",
    "WriteDeniedError",
    "new_token",
    "objects_at",
]

_T = TypeVar("_T")

#: Attempts of one operation whose errors may clear on their own.
ATTEMPTS = 8
#: Largest pause between two attempts (seconds; jittered).
MAX_PAUSE = 4.0
#: Largest object read as JSON (manifests, leases, hints).
MAX_JSON = 64 << 20


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object found by :meth:`Objects.listing`."""

    rel: str
    """Its name under the prefix."""
    size: int
    """Its bytes."""
    modified: float
    """When it was last written, by the store's clock (seconds since the epoch)."""


class WriteDeniedError(PermissionError):
    """The remote refused a write (403 ``AccessDenied``, or a read-only directory): the
    credentials may read but not write."""


def _writing(rel: str, where: str, call: Callable[[], _T]) -> _T:
    """Run a write; a refusal of the credentials becomes :class:`WriteDeniedError` naming ``where``."""
    try:
        return call()
    except WriteDeniedError:
        raise
    except PermissionError:
        denied = "AccessDenied"
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise WriteDeniedError(errno.EROFS, f"{where!r} is read-only") from None
        if _status(exc) != 403 and not str(exc).startswith("Forbidden"):  # gcsfs: "Forbidden"
            raise
        denied = "Forbidden"
    except Exception as exc:  # adlfs passes the Azure SDK's own errors through
        if _status(exc) != 403:
            raise
        denied = "AuthorizationPermissionMismatch"
    raise WriteDeniedError(errno.EACCES, f"{where!r}: writing {rel!r} was refused (403 {denied})")


def new_token() -> str:
    """A fresh writer token: unique across machines and processes."""
    return uuid.uuid4().hex


class Objects:
    """Named objects under one prefix; subclasses implement the raw operations."""

    url: str
    """The prefix, as the user gave it (shown in messages)."""

    def _create(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` unless it exists; True if this call created it (raw answer)."""
        raise NotImplementedError

    def _read(self, rel: str) -> bytes | None:
        raise NotImplementedError

    def _write(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def _put_file(self, local: Path, rel: str) -> None:
        raise NotImplementedError

    def _get_file(self, rel: str, local: Path) -> None:
        raise NotImplementedError

    def _list(self) -> list[ObjectInfo]:
        raise NotImplementedError

    def _delete(self, rel: str) -> None:
        raise NotImplementedError

    def listing(self, under: str = "") -> list[ObjectInfo]:
        """Every object under the prefix whose name starts with ``under`` (for the tools:
        the cache itself never lists)."""
        return [o for o in _retrying(self._list) if o.rel.startswith(under)]

    def delete(self, rel: str) -> None:
        """Delete ``rel`` (absent already: nothing to do)."""
        def call() -> None:
            with contextlib.suppress(FileNotFoundError):
                self._delete(rel)
        _writing(rel, self.url, lambda: _retrying(call))

    def where(self, rel: str) -> str:
        """The URL (or path) of ``rel``, for messages."""
        return f"{self.url.rstrip('/')}/{rel}"

    def create(self, rel: str, body: Mapping[str, Any], token: str) -> bool:
        """Create ``rel`` holding ``body`` and ``token`` unless it exists; True if ours.

        A raw "exists" (or an error that may hide a success) is checked by
        reading the object back: it is ours exactly when it holds our token.
        """
        return _writing(rel, self.url, lambda: self._create_json(rel, body, token))

    def _create_json(self, rel: str, body: Mapping[str, Any], token: str) -> bool:
        data = json.dumps({**body, "writer": token}, sort_keys=True).encode()
        for attempt in range(ATTEMPTS):
            try:
                if self._create(rel, data):
                    return True
            except OSError as exc:
                if not _transient(exc) or attempt == ATTEMPTS - 1:
                    raise
                _pause(attempt)
            found = self.read_json(rel)
            if found is not None:
                return found.get("writer") == token
            # absent after a failed create (a 409, or an error before it applied): again
        raise OSError(errno.EIO, f"could not create {self.where(rel)!r}")

    def create_raw(self, rel: str, data: bytes) -> bool:
        """The store's own answer to a create of ``rel`` (no read-back): True if it says
        created."""
        return _writing(rel, self.url, lambda: _retrying(lambda: self._create(rel, data)))

    def read(self, rel: str) -> bytes | None:
        """The object's bytes, None if there is no such object."""
        return _retrying(lambda: self._read(rel))

    def read_json(self, rel: str) -> dict[str, Any] | None:
        """The object as a JSON object, None if absent.

        Raises
        ------
        ValueError
            If it is not a JSON object, or is larger than :data:`MAX_JSON` (named in the
            message).
        """
        raw = self.read(rel)
        if raw is None:
            return None
        if len(raw) > MAX_JSON:
            raise ValueError(f"{self.where(rel)!r} is {len(raw)} bytes, more than the {MAX_JSON} "
                             "a JSON object of a remote namespace may hold; it was written by "
                             "something else: remove the namespace's prefix")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{self.where(rel)!r} is not JSON ({exc}); it was damaged or "
                             "written by something else: remove the namespace's prefix") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{self.where(rel)!r} is not a JSON object")
        return doc

    def write(self, rel: str, body: Mapping[str, Any]) -> None:
        """Write ``rel`` (replacing it) as JSON; only for objects one writer owns or hints."""
        data = json.dumps(dict(body), sort_keys=True).encode()
        _writing(rel, self.url, lambda: _retrying(lambda: self._write(rel, data)))

    def put_file(self, local: Path, rel: str) -> None:
        """Upload the local file as ``rel`` (whole, atomic: readers see all of it or nothing)."""
        _writing(rel, self.url, lambda: _retrying(lambda: self._put_file(local, rel)))

    def put_files(self, files: list[tuple[Path, str]]) -> None:
        """Upload each local file as its object (each whole and atomic; several at once where
        the store allows)."""
        if files:
            _writing(files[0][1], self.url, lambda: _retrying(lambda: self._put_files(files)))

    def _put_files(self, files: list[tuple[Path, str]]) -> None:
        for local, rel in files:
            self._put_file(local, rel)

    def get_file(self, rel: str, local: Path) -> None:
        """Download ``rel`` into the local file ``local``.

        Raises
        ------
        FileNotFoundError
            If there is no such object.
        """
        _retrying(lambda: self._get_file(rel, local))


def _transient(exc: OSError) -> bool:
    """Whether an error may clear on its own (503, 409, 500, a timeout, a reset)."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError,
                        IsADirectoryError, NotADirectoryError)):
        return False
    text = str(exc)
    return not any(s in text for s in ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId"))


def _pause(attempt: int) -> None:
    time.sleep(random.uniform(0.5, 1.0) * min(MAX_PAUSE, 0.1 * 2**attempt))


def _retrying(call: Callable[[], _T]) -> _T:
    for attempt in range(ATTEMPTS):
        try:
            return call()
        except OSError as exc:
            if not _transient(exc) or attempt == ATTEMPTS - 1:
                raise
            _pause(attempt)
    raise AssertionError("unreachable")


class S3Objects(Objects):
    """Objects at an fsspec URL whose filesystem supports create-only writes: ``s3://``
    (s3fs: ``If-None-Match: *``), ``gs://`` (gcsfs: ``ifGenerationMatch=0``), ``az://``
    (adlfs: ``If-None-Match: *``); each answers a taken name with ``FileExistsError``.
    ``url`` is kept with its credentials redacted (:func:`~.urls.redact`)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None) -> None:
        self.url = redact(url)
        self._fs, self._root = filesystem(url, storage_options)
        protocols = self._fs.protocol if isinstance(self._fs.protocol, tuple) else (
            self._fs.protocol,)
        # s3fs asks for the size first (a HEAD) unless a whole read is one request; the releases
        # before 2026.3.0 (when it began to read large objects concurrently) neither do it nor take
        # the option
        concurrent = "s3" in protocols and "max_concurrency" in inspect.signature(
            self._fs._cat_file).parameters
        self._read_kw: dict[str, Any] = {"max_concurrency": 1} if concurrent else {}

    def _path(self, rel: str) -> str:
        return f"{self._root}/{rel}"

    def _create(self, rel: str, data: bytes) -> bool:
        try:
            self._fs.pipe_file(self._path(rel), data, mode="create")
        except FileExistsError:
            return False
        except OSError as exc:
            if _status(exc) in (304, 412):
                return False  # an older MinIO answers 304 Not Modified for "exists"
            raise
        return True

    def _read(self, rel: str) -> bytes | None:
        try:
            return bytes(self._fs.cat_file(self._path(rel), **self._read_kw))
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise PermissionError(
                errno.EACCES,
                f"{self.where(rel)!r}: reading it was refused ({exc}). The credentials need "
                "s3:GetObject on the prefix and s3:ListBucket on the bucket: without "
                "s3:ListBucket, S3 answers 403 Access Denied instead of 404 for an object that "
                "does not exist, and a node reads the next manifest until it is absent (see "
                "the bucket policy in the documentation's 'One cache for a cluster')") from None

    def _write(self, rel: str, data: bytes) -> None:
        self._fs.pipe_file(self._path(rel), data)

    def _put_file(self, local: Path, rel: str) -> None:
        self._fs.put_file(str(local), self._path(rel))

    def _put_files(self, files: list[tuple[Path, str]]) -> None:
        self._fs.put([str(local) for local, _rel in files], [self._path(rel) for _l, rel in files])

    def _get_file(self, rel: str, local: Path) -> None:
        self._fs.get_file(self._path(rel), str(local))

    def _list(self) -> list[ObjectInfo]:
        self._fs.invalidate_cache(self._root)
        try:
            found = self._fs.find(self._root, detail=True)
        except FileNotFoundError:
            return []
        return [ObjectInfo(str(path)[len(self._root) + 1:], int(info.get("size") or 0),
                           _when(info))
                for path, info in found.items() if info.get("type", "file") == "file"]

    def _delete(self, rel: str) -> None:
        self._fs.rm_file(self._path(rel))


def _status(exc: BaseException) -> int | None:
    """The HTTP status of the answer behind ``exc`` (s3fs keeps botocore's error as the
    cause; the Azure SDK's errors hold it), None if there was none."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


class DirectoryObjects(Objects):
    """Objects as files of a directory shared by every machine (create-only by ``link``)."""

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = root
        self.url = url if url is not None else str(root)

    def _path(self, rel: str) -> Path:
        return self.root / rel

    def _temp(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.parent / f".{final.name}.{new_token()}.tmp"

    def _write_temp(self, final: Path, data: bytes) -> Path:
        tmp = self._temp(final)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def _create(self, rel: str, data: bytes) -> bool:
        final = self._path(rel)
        tmp = self._write_temp(final, data)
        try:
            os.link(tmp, final)  # fails if the name exists, on every machine's view
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise UnsafeRemoteError(
                    f"the shared directory {self.url!r} does not support hard links "
                    f"({exc.strerror}), the create-only write a commit needs; use a filesystem "
                    "with them (NFS, Lustre, GPFS, BeeGFS, CephFS) or an object store"
                ) from None
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _sync_dir(final.parent)
        return True

    def _read(self, rel: str) -> bytes | None:
        try:
            return self._path(rel).read_bytes()
        except FileNotFoundError:
            return None

    def _write(self, rel: str, data: bytes) -> None:
        final = self._path(rel)
        os.replace(self._write_temp(final, data), final)

    def _put_file(self, local: Path, rel: str) -> None:
        final = self._path(rel)
        tmp = self._temp(final)
        shutil.copyfile(local, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _sync_dir(final.parent)

    def _get_file(self, rel: str, local: Path) -> None:
        shutil.copyfile(self._path(rel), local)

    def _list(self) -> list[ObjectInfo]:
        out = []
        for top, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # a create or an upload under way
                path = Path(top) / name
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    out.append(ObjectInfo(path.relative_to(self.root).as_posix(), st.st_size,
                                          st.st_mtime))
        return out

    def _delete(self, rel: str) -> None:
        os.unlink(self._path(rel))


def _when(info: Mapping[str, Any]) -> float:
    """When an fsspec listing entry was last written (s3fs: ``LastModified``, adlfs:
    ``last_modified``, gcsfs and local files: ``mtime``), seconds since the epoch."""
    for name in ("LastModified", "last_modified", "mtime", "updated"):
        value = info.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def objects_at(remote: str, storage_options: Mapping[str, Any] | None) -> Objects:
    """The objects under ``remote``: a URL of :data:`~.urls.SHARED_SCHEMES` (a ``file://``
    URL too) or a directory path.

    Raises
    ------
    ValueError
        If the URL's scheme gives no create-only write (the message says what does).
    """
    if is_url(remote):
        if shared_scheme(remote) != "file":
            return S3Objects(remote.rstrip("/"), storage_options)
        local = file_url_path(remote)
        assert local is not None
        return DirectoryObjects(local, remote)
    return DirectoryObjects(Path(remote).absolute())
