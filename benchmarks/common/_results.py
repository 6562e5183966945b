"""A run's results file: rewritten atomically as figures come, resumable.

``NAME.json`` holds one report (``env``, ``config``, ``methods``, ``open_vs_n``,
``targets``); ``NAME.md`` its table. Both are rewritten after each method with
:func:`write_atomic` (a temporary file in the same directory, flushed to disk, then
renamed over the old one), so an interrupted run leaves the figures it measured, never
a half-written file. :meth:`ResultsFile.resume` gives back a previous report of the
same configuration, whose measured methods a resumed run skips. Every report is stamped
(:mod:`benchmarks.common._stamp`): :meth:`ResultsFile.save` refuses one that is not, and
ends its table with the stamp's lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common._stamp import footer, unstamped

#: configuration fields that must match for a run to resume another's results
IDENTITY = ("images", "seed", "agents", "open_sizes", "budget_s", "quick", "start_method",
            "open_repeats", "agent_timeout_s", "allow_oom")


class ResumeMismatchError(ValueError):
    """The results file was measured with another configuration."""

    def __init__(self, path: str, differences: dict[str, tuple[Any, Any]]) -> None:
        self.path = path
        self.differences = differences
        diff = "; ".join(f"{k}: {old!r} there, {new!r} now" for k, (old, new) in
                         differences.items())
        super().__init__(f"cannot resume {path}: it was measured with another configuration "
                         f"({diff}); run with the same options, drop --resume to start "
                         "over, or pass --out NAME for a new results file")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.differences)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file whole."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a run's configuration that its figures depend on."""
    return {key: config.get(key) for key in IDENTITY}


class ResultsFile:
    """``DIR/NAME.json`` and ``DIR/NAME.md``; plots ``DIR/[NAME-]<plot>.png``.

    The plots of the default name ``latest`` keep their plain names
    (``time_to_vectors.png``), which the README cites.
    """

    def __init__(self, directory: Path, name: str = "latest") -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"results name {name!r} must be a plain file name, like "
                             "'original-scale'")
        self.directory = directory
        self.name = name
        self.json = directory / f"{name}.json"
        self.md = directory / f"{name}.md"

    @property
    def plot_prefix(self) -> str:
        return "" if self.name == "latest" else f"{self.name}-"

    def load(self) -> dict[str, Any] | None:
        """The report in the file, or None if there is none."""
        try:
            report: dict[str, Any] = json.loads(self.json.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ValueError(f"{self.json} is not a results file ({exc}); move it away or "
                             "drop --resume") from None
        return report

    def resume(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The previous report if it was measured with the same configuration; None if
        there is no file; :class:`ResumeMismatchError` if the configuration differs."""
        report = self.load()
        if report is None:
            return None
        old, new = identity(report.get("config", {})), identity(config)
        differences = {k: (old[k], new[k]) for k in IDENTITY if old[k] != new[k]}
        if differences:
            raise ResumeMismatchError(str(self.json), differences)
        return report

    def save(self, report: dict[str, Any], markdown: str) -> str:
        """Write the report and its table, the stamp's lines at its end (each atomically);
        return the table as written.

        Raises
        ------
        ValueError
            If the report or one of its methods has no stamp.
        """
        missing = unstamped(report)
        if missing:
            raise ValueError(f"{self.json}: {', '.join(missing)} not stamped; stamp the report "
                             "with benchmarks.common._stamp.stamp(report, run) first")
        markdown = markdown.rstrip("\n") + "\n" + footer(report)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self.json, json.dumps(report, indent=1) + "\n")
        write_atomic(self.md, markdown)
        return markdown
