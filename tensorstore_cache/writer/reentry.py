"""Which builds a process and its ancestors are running, so that no build waits for itself.

A process building a cache holds the cache's build lock until its worker
processes finish. Were one of those workers (or anything it starts) to ask
for the same cache, it would wait for that lock forever while its parent
waits for it: a deadlock with no message. The same holds, within one
thread, for a loader that asks for the cache it is being used to build.

So every build *claims* its directory for as long as it runs: in a
context variable of the thread that builds (seen by the loader when it
runs in that thread), and in the environment variable ``TSC_BUILDING`` of
the build's worker processes (inherited by whatever they start). A claimed
directory asked for again fails at once with :class:`ReentrantBuildError`.
Other threads of the building process are not concerned: they wait for the
lock like any other process would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from ..errors import ReentrantBuildError

__all__ = ["BUILDING_ENV", "building", "check_not_building", "worker_environment"]

#: Environment variable of a build's worker processes: the directories their builder builds.
BUILDING_ENV = "TSC_BUILDING"

_claims: ContextVar[tuple[str, ...]] = ContextVar("tensorstore_cache_building", default=())


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def _inherited() -> list[str]:
    raw = os.environ.get(BUILDING_ENV)
    if not raw:
        return []
    try:
        claims = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(claims, list):
        return []
    return [c for c in claims if isinstance(c, str)]


def check_not_building(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ReentrantBuildError` if ``path`` is being built by this thread or a parent.

    Parameters
    ----------
    path
        A cache namespace or a store directory about to be built.
    """
    key = _key(path)
    name = Path(key).name
    if key in _claims.get():
        raise ReentrantBuildError(
            f"the loader asked for {name!r} while it is being used to build it ({key!r}); "
            "this would wait forever for the build's own lock. A loader must not call "
            "cached() or build_store() on the cache it fills: compute the item directly",
            key,
        )
    if key in _inherited():
        raise ReentrantBuildError(
            f"this process (pid {os.getpid()}) is a worker of the build of {name!r} ({key!r}) "
            f"by its parent process (pid {os.getppid()}), which holds that build's lock: "
            "building it here too would wait forever. The loader, or the module it is "
            "imported from, asks for the cache it is used to fill; move that call out of the "
            "loader, or under `if __name__ == \"__main__\":` in the module that defines it",
            key,
        )


@contextmanager
def building(path: str | os.PathLike[str]) -> Iterator[None]:
    """Claim ``path`` for the duration of a build in this thread (after checking it is free).

    Raises
    ------
    ReentrantBuildError
        If this thread or a parent process already builds ``path``.
    """
    check_not_building(path)
    token = _claims.set((*_claims.get(), _key(path)))
    try:
        yield
    finally:
        _claims.reset(token)


def worker_environment() -> dict[str, str]:
    """The environment variables that tell a build's worker processes what their parent builds."""
    claims = list(dict.fromkeys([*_inherited(), *_claims.get()]))
    return {BUILDING_ENV: json.dumps(claims)}
