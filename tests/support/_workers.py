"""What the tests of a build's worker processes (:mod:`tensorstore_cache.writer.procs`) run
in them: importable by name, as every task and initializer of a pool is sent."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

_started: list[str] = []


def die_once(marker: str, before: Callable[[], None] | None = None) -> None:
    """SIGKILL this process if no process did so for ``marker`` yet.

    The marker file, created with ``O_EXCL`` and holding the pid, makes it happen once,
    in whichever process gets there first; ``before`` runs just before the kill.
    """
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    if before is not None:
        before()
    os.kill(os.getpid(), signal.SIGKILL)


def note_start(marker: str) -> None:
    """An initializer: remember ``marker``."""
    _started.append(marker)


def wait_for(path: str) -> None:
    """An initializer that does not return before ``path`` exists (a worker kept starting)."""
    while not Path(path).exists():
        time.sleep(0.01)


def wait_for_own_gate(gates: str) -> None:
    """An initializer that does not return before ``gates/<its pid>`` exists."""
    wait_for(os.path.join(gates, str(os.getpid())))


def whoami(x: int) -> tuple[int, int, list[str]]:
    """A task: the worker's pid, ``x`` squared, and what its initializer noted."""
    return os.getpid(), x * x, list(_started)


def fails(message: str) -> None:
    """A task that raises."""
    raise ValueError(message)


def dies(code: int) -> None:
    """A task whose worker exits at once, without a word."""
    os._exit(code)


def unpicklable() -> object:
    """A task whose result cannot be sent back."""
    return lambda: None


def loaded() -> list[str]:
    """A task: the modules of this package the worker has imported."""
    return sorted(m for m in sys.modules if m.startswith("tensorstore_cache"))


def uses_the_package() -> tuple[str, bool]:
    """A task that uses a name of the package itself (``import tensorstore_cache``)."""
    import tensorstore_cache

    return tensorstore_cache.__version__, "open_store" in dir(tensorstore_cache)


def argv() -> list[str]:
    """A task: the worker's ``sys.argv``."""
    return list(sys.argv)


class NeedsTwoError(Exception):
    """An error that pickles but cannot be unpickled (its ``__init__`` takes two arguments)."""

    def __init__(self, first: object, second: object) -> None:
        super().__init__(f"{first} and {second}")


def raises_unloadable() -> None:
    """A task whose error cannot be rebuilt in the building process."""
    raise NeedsTwoError("one", "two")
