"""A device worker's process: the variables it starts with and its allocator.

A device worker waits passively (OpenMP threads sleep rather than spin,
leaving the cores to the CPU workers that prepare) and keeps the memory it
frees for its next batch (a model's activations are not faulted in again
page by page at every batch), unless the user set either up.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["MALLOC_VARIABLES", "device_environment", "keep_freed_memory"]


def device_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a device worker is started with besides ``environ``'s.

    ``OMP_WAIT_POLICY=PASSIVE`` unless ``environ`` sets it: the worker's
    OpenMP threads (torch's on ``"cpu"``) sleep rather than spin while they
    wait, leaving the cores to the CPU workers that prepare. (The worker's
    allocator is set up in the worker: :func:`keep_freed_memory`.)

    Parameters
    ----------
    environ
        The building process's environment.

    Returns
    -------
    dict
        Variable -> value, none of them set in ``environ``.
    """
    return {} if "OMP_WAIT_POLICY" in environ else {"OMP_WAIT_POLICY": "PASSIVE"}


#: Blocks up to this size a device worker's glibc allocator serves from its heap, and free
#: memory it keeps at the heap's top (see :func:`keep_freed_memory`).
KEEP_FREED_BYTES = 1 << 30
#: The largest mmap threshold glibc before 2.35 accepts (half its heap's largest size).
OLD_GLIBC_MMAP_MAX = 32 << 20
#: What glibc's ``mallopt`` calls them (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Environment variables by which a user sets glibc's allocator up themselves.
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                    "MALLOC_MMAP_MAX_")


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> int:
    """In a device worker: have glibc's allocator keep the memory it frees for the next batch.

    With glibc's defaults, a block larger than 32 MiB (and any block, once
    the adaptive threshold is off) is mapped when allocated and unmapped
    when freed, and a model's activations are faulted in page by page at
    every batch: this sets the mmap threshold and the trim threshold to
    :data:`KEEP_FREED_BYTES` (the mmap threshold to :data:`OLD_GLIBC_MMAP_MAX`
    where glibc refuses more), by ``mallopt`` in this process only, so that
    no process the loader starts inherits it. It does nothing if the
    environment sets the allocator up (:data:`MALLOC_VARIABLES`, a
    ``glibc.malloc`` tunable, or an allocator in ``LD_PRELOAD`` such as
    jemalloc), or the C library is not glibc.

    Parameters
    ----------
    environ
        The environment to look at (default: this process's).

    Returns
    -------
    int
        The mmap threshold set, in bytes; 0 if nothing was changed.
    """
    env = os.environ if environ is None else environ
    if (any(name in env for name in MALLOC_VARIABLES)
            or "glibc.malloc" in env.get("GLIBC_TUNABLES", "")
            or "malloc" in env.get("LD_PRELOAD", "")):
        return 0
    try:
        if not str(os.confstr("CS_GNU_LIBC_VERSION")).startswith("glibc "):
            return 0
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return 0
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for threshold in (KEEP_FREED_BYTES, OLD_GLIBC_MMAP_MAX):
        if mallopt(_M_MMAP_THRESHOLD, threshold) == 1:
            # only with the mmap threshold set: the trim threshold alone turns off the
            # adaptive mmap threshold, and every block over 128 KiB is mapped again
            mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
            return threshold
    return 0
