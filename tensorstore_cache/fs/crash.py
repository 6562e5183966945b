"""The crash-test hook: every step a writer takes on disk can be the one it is killed at.

Each mkdir, file creation, write, fsync and rename of a build calls
:func:`io_step` just before it runs: :func:`~tensorstore_cache.fs.opens.make_dir`
and the durable writes of :mod:`~tensorstore_cache.fs.durable` do it
themselves, and so does every other rename that publishes something. The
crash tests kill a builder at each step in turn and check that what is left
is either nothing or a complete store.
"""

from __future__ import annotations

import os
import signal

__all__ = ["io_step"]

# With TSC_TEST_KILL_AT=k in the environment, the k-th I/O step of this process SIGKILLs it
# just before the step runs; k=-1 only counts the steps (in ``_io_trace``). Unset: one
# global test.
_KILL_AT = int(os.environ.get("TSC_TEST_KILL_AT") or 0)
_io_trace: list[str] = []


def io_step(what: str) -> None:
    """Mark one I/O step of a writer (a no-op unless the crash-test hook is armed)."""
    if _KILL_AT:
        _io_trace.append(what)
        # ">=": the syncs of a tree run in threads, one of which may count past k first
        if 0 < _KILL_AT <= len(_io_trace):
            os.kill(os.getpid(), signal.SIGKILL)
