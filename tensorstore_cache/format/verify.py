"""Checking a store's files against the checksums recorded when it was built.

Every store records, in its group attributes, the size and XXH3-128 of each
of its files (all but the group ``zarr.json``, which holds the list). A
verification re-reads every file and reports every difference at once:
missing files, wrong sizes (truncation), wrong contents (flipped bytes),
files that should not be there, symlinks and damaged metadata.

Examples
--------
>>> report = verify_segment("covers.tsc")  # doctest: +SKIP
>>> report.ok                            # doctest: +SKIP
True
>>> print(report)                        # doctest: +SKIP
covers.tsc: OK, 14 files, 246.1 MB checked
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import CorruptStoreError, StoreNotFoundError
from ..fs import Trust, file_digest, open_regular
from .metadata import GroupMetadata

__all__ = ["Problem", "VerifyReport", "verify_segment", "verify_segments"]

_CHUNK = 8 << 20


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one file of a store."""

    path: str
    """The file (or directory) concerned."""
    kind: str
    """``"metadata"``, ``"missing"``, ``"size"``, ``"checksum"``, ``"unreadable"``, ``"extra"``
    or ``"offsets"`` (a ragged field's offsets or shapes that do not hold its values)."""
    detail: str
    """What was found, in words."""

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass(slots=True)
class VerifyReport:
    """The outcome of :func:`~tensorstore_cache.verify_store`.

    Attributes
    ----------
    location : str
        The store checked.
    files_checked : int
        Files whose size and checksum were compared.
    bytes_checked : int
        Bytes read and hashed.
    problems : list of Problem
        Everything found wrong, in path order; empty for a sound store.

    Examples
    --------
    >>> import os
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> os.remove("covers.tsc/key_row/c/0")
    >>> report = tsc.verify_store("covers.tsc")
    >>> report.ok, report.bad_files, report.problems[0].kind
    (False, ['covers.tsc/key_row/c/0'], 'missing')
    """

    location: str
    files_checked: int = 0
    bytes_checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    @property
    def bad_files(self) -> list[str]:
        """Every file with a problem, once each, in order."""
        return list(dict.fromkeys(p.path for p in self.problems))

    def extend(self, other: VerifyReport) -> None:
        """Add the counts and problems of ``other`` (another segment) to this report.

        Parameters
        ----------
        other
            The report of another segment of the same store.
        """
        self.files_checked += other.files_checked
        self.bytes_checked += other.bytes_checked
        self.problems.extend(other.problems)

    def raise_if_bad(self) -> None:
        """Raise :class:`CorruptStoreError` naming every bad file, if there is any.

        Raises
        ------
        CorruptStoreError
            With ``.files`` listing every bad file and ``.path`` the first one.
        """
        if self.problems:
            bad = self.bad_files
            raise CorruptStoreError(
                f"{self.location}: {len(bad)} damaged file(s):\n{self._listing()}\n"
                "The store cannot be trusted; delete it and build it again.",
                bad[0],
                bad,
            )

    def _listing(self) -> str:
        lines = [f"  {p}" for p in self.problems[:_SHOWN]]
        if len(self.problems) > _SHOWN:
            lines.append(f"  ... and {len(self.problems) - _SHOWN} more problems (see .files)")
        return "\n".join(lines)

    def __str__(self) -> str:
        size = f"{self.bytes_checked / 1e6:.1f} MB"
        if self.ok:
            return f"{self.location}: OK, {self.files_checked} files, {size} checked"
        return (
            f"{self.location}: {len(self.problems)} problem(s) in {self.files_checked} files "
            f"({size} checked):\n{self._listing()}"
        )


#: Problems a report names in its text (``.problems`` and ``.files`` hold every one).
_SHOWN = 20


def _check_file(
    root: Path, rel: str, size: int, digest: str, report: VerifyReport, buf: bytearray,
    root_fd: int, trust: Trust | None,
) -> None:
    path = root / rel
    try:
        fd = open_regular(path, root, root_fd, trust=trust)
    except CorruptStoreError as exc:
        if "is missing" in str(exc):
            report.problems.append(Problem(str(path), "missing", "missing"))
        else:
            detail = str(exc).removeprefix(f"{path} ")
            report.problems.append(Problem(str(path), "unreadable", detail))
        return
    try:
        found = os.fstat(fd).st_size
        if found != size:
            what = "truncated" if found < size else "longer than recorded"
            report.problems.append(
                Problem(str(path), "size", f"{what}: {found} bytes, the store recorded {size}")
            )
            return
        try:
            read, found_digest = file_digest(fd, buf)
        except OSError as exc:
            report.problems.append(Problem(str(path), "unreadable", f"read error: {exc}"))
            return
        report.files_checked += 1
        report.bytes_checked += read
        if read != size:
            report.problems.append(
                Problem(str(path), "size", f"changed while being read ({read} of {size} bytes)")
            )
        elif found_digest != digest:
            report.problems.append(
                Problem(
                    str(path),
                    "checksum",
                    f"contents differ from those written (xxh3-128 {found_digest}, "
                    f"recorded {digest})",
                )
            )
    finally:
        os.close(fd)


def _extras(root: Path, listed: Iterable[str], root_fd: int) -> list[Problem]:
    """Return a problem for every entry under ``root`` that the store does not list."""
    files = set(listed) | {"zarr.json"}
    dirs = {"."}
    for rel in files:
        parent = os.path.dirname(rel)
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    found: list[Problem] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd):
        base = os.path.normpath(dirpath)
        for name in [*dirnames, *filenames]:
            rel = os.path.normpath(os.path.join(base, name))
            full = str(root / rel)
            try:
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                if rel not in files:  # a listed symlink is reported by _check_file
                    target = os.readlink(name, dir_fd=dir_fd)
                    found.append(Problem(full, "extra", f"unexpected symlink to {target!r}"))
            elif stat.S_ISDIR(mode):
                if rel not in dirs:
                    found.append(Problem(full, "extra", "directory not part of the store"))
            elif rel not in files:
                found.append(Problem(full, "extra", "file not part of the store"))
        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(base, d)) in dirs]
    return found


def verify_segment(
    root: str | os.PathLike[str], root_fd: int | None = None, *, trust: Trust | None = None
) -> VerifyReport:
    """Check one store directory: metadata, then every file's size and checksum.

    Parameters
    ----------
    root
        A store directory (one zarr v3 group written by this library).
    root_fd
        An open descriptor of that directory (an open store's): check the
        directory it refers to, even if another has been renamed to ``root``.
    trust
        Checked on every directory and file opened (an open store's; default:
        a store named by its path, see :func:`~tensorstore_cache.fs.opens.open_regular`).

    Returns
    -------
    VerifyReport
        Every problem found (the report does not raise).

    Raises
    ------
    StoreNotFoundError
        If ``root`` holds no store at all.
    """
    base = Path(os.fspath(root))
    report = VerifyReport(str(base))
    try:
        fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if root_fd is None \
            else os.dup(root_fd)
    except (FileNotFoundError, NotADirectoryError):
        raise StoreNotFoundError(f"no store at {str(base)!r}") from None
    try:
        try:
            files = GroupMetadata.read(base, fd, trust=trust).files
        except StoreNotFoundError:
            if root_fd is None:
                raise
            report.problems.append(Problem(
                str(base / "zarr.json"), "missing",
                "missing: the store was deleted or replaced after it was opened",
            ))
            return report
        except CorruptStoreError as exc:
            path = exc.path or str(base / "zarr.json")
            report.problems.append(Problem(path, "metadata", str(exc)))
            return report
        buf = bytearray(min(_CHUNK, max((size for size, _ in files.values()), default=0) + 1))
        for rel, (size, digest) in sorted(files.items()):
            _check_file(base, rel, size, digest, report, buf, fd, trust)
        report.problems.extend(_extras(base, files, fd))
    finally:
        os.close(fd)
    report.problems.sort(key=lambda p: p.path)
    return report


class _OpenDirectory(Protocol):
    @property
    def root(self) -> Path: ...
    @property
    def dir_fd(self) -> int: ...
    @property
    def trust(self) -> Trust: ...


def verify_segments(location: str, segments: Iterable[_OpenDirectory]) -> VerifyReport:
    """Check every open store directory of a store (each with its ``root`` and ``dir_fd``).

    Returns
    -------
    VerifyReport
        One report for ``location``, every segment's problems in it.
    """
    report = VerifyReport(location)
    for seg in segments:
        report.extend(verify_segment(seg.root, seg.dir_fd, trust=seg.trust))
    return report
