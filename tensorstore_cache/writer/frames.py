"""The one formatter of the frames a failure reports: the loader's last frames."""

from __future__ import annotations

import os
import traceback

__all__ = ["TRACE_FRAMES", "loader_frames"]

#: How many of the loader's own frames a failure reports.
TRACE_FRAMES = 3
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
