"""What a failure reports: the loader's last frames, and the error of a build whose sources
failed (the one formatter of each)."""

from __future__ import annotations

import os
import textwrap
import traceback
from collections.abc import Sequence

from ..errors import BuildError

__all__ = ["TRACE_FRAMES", "loader_frames", "sources_failed"]

#: How many of the loader's own frames a failure reports.
TRACE_FRAMES = 3
#: How many failing sources the message of a build names (all are in its ``failures``).
SHOWN = 10
#: This package's directory: its frames are the build's, never the loader's.
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def loader_frames(exc: BaseException) -> str:
    """The last :data:`TRACE_FRAMES` frames of ``exc``'s traceback that are neither the
    writer's nor the interpreter's frozen modules', formatted (empty if there are none).

    Parameters
    ----------
    exc
        What the loader (or its unpickling, or its ``setup``) raised.
    """
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(_HERE) and not f.filename.startswith("<frozen ")
    ]
    return "".join(traceback.format_list(frames[-TRACE_FRAMES:])).rstrip()


def sources_failed(failures: Sequence[tuple[str, str, str]], n: int, target: str) -> BuildError:
    """The error of a build of ``n`` sources at ``target`` that some failed: which, and why,
    with the loader's last frames of each failure.

    Parameters
    ----------
    failures
        Each failing source as ``(key, "Type: message", the loader's frames)``, in row order.
    n
        The build's sources.
    target
        What the build was to publish (named by the message).
    """
    lines = []
    before = ""
    for key, reason, where in failures[:SHOWN]:
        lines.append(f"  {key}: {reason}")
        if where and where == before:
            lines.append("      (raised at the same place as above)")
        elif where:
            lines.append(textwrap.indent(where, "    "))
        before = where
    shown = "\n".join(lines)
    more = (f"\n  ... and {len(failures) - SHOWN} more (see .failures)"
            if len(failures) > SHOWN else "")
    message = (
        f"{len(failures)} of {n} sources could not be loaded, so {target!r} was not "
        f"built:\n{shown}{more}\nFix or remove them, or pass on_error='skip' to build the rest."
    )
    return BuildError(message, [(key, reason) for key, reason, _where in failures])
