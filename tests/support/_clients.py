"""Importable helpers for the tests that use the library where its users do.

Scripts, notebooks, sweep agents and DataLoader workers started by those
tests import this module (the tests put the repository on ``PYTHONPATH``).
Every loader here logs each call as one ``"<pid> <path>\\n"`` line appended
with ``O_APPEND`` (:func:`log_call`), so a test can tell how often each item
was computed and by which processes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc

REPO = Path(__file__).resolve().parents[2]
#: Output size of the image loaders here: small, so that builds are quick.
SIZE = (8, 8)
ITEM_SHAPE = (3, *SIZE)
#: Environment variable naming the call log of :func:`logged_image`.
LOG_ENV = "TSC_TEST_LOG"


def in_pool_worker() -> bool:
    """Whether this process is a worker of a build's pool (its builder told it so)."""
    from tensorstore_cache.writer.reentry import BUILDING_ENV

    return bool(os.environ.get(BUILDING_ENV))


def log_call(log: str | os.PathLike[str], key: str) -> None:
    """Append ``"<pid> <key>"`` to ``log`` in one ``write``."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {key}\n".encode())
    finally:
        os.close(fd)


def calls(log: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """Every ``(pid, key)`` logged so far."""
    path = Path(log)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, key = line.split(" ", 1)
        out.append((int(pid), key))
    return out


def expected(paths: list[str]) -> np.ndarray:
    """The vectors of ``paths`` computed directly by the built-in image loader."""
    image = tsc.ImageLoader(size=SIZE)
    return np.stack([image(p) for p in paths])


def logged_image(path: str) -> np.ndarray:
    """A module-level loader: the image loader, logging to ``$TSC_TEST_LOG``."""
    log_call(os.environ[LOG_ENV], path)
    return tsc.ImageLoader(size=SIZE)(path)


class LoggedImages:
    """The built-in image loader at :data:`SIZE`, logging every call, optionally slow.

    ``delay`` is no parameter of the vectors (they do not depend on it), so a
    slow and a fast instance fill the same cache.
    """

    loader_id = "tests.logged_images/1"
    item_shape = ITEM_SHAPE

    def __init__(self, log: str | os.PathLike[str], delay: float = 0.0) -> None:
        self.log = str(log)
        self.delay = delay

    def __call__(self, path: str) -> np.ndarray:
        log_call(self.log, path)
        if self.delay:
            time.sleep(self.delay)
        return tsc.ImageLoader(size=SIZE)(path)


class AsksForItsOwnCache:
    """A loader that calls ``cached()`` on the very cache it is used to fill."""

    loader_id = "tests.asks_for_its_own_cache/1"
    item_shape = ITEM_SHAPE

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def __call__(self, path: str) -> np.ndarray:
        store = tsc.cached([path], cache_dir=self.cache_dir, loader=self, workers=1,
                           progress=False)
        return np.asarray(store[path])


def environment(**extra: str) -> dict[str, str]:
    """The environment of a user's process: this one's, able to import ``tests``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def python() -> str:
    """The interpreter users of this checkout run."""
    return sys.executable


# -- torch DataLoader workers -------------------------------------------------------

class ByPath:
    """A map-style dataset of store items by path; the store is opened in each worker."""

    def __init__(self, location: str, paths: list[str]) -> None:
        self.location = location
        self.paths = paths
        self.store: tsc.CacheStore | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, int]:
        assert self.store is not None, "worker_init_fn did not open the store"
        return i, np.array(self.store[self.paths[i]]), os.getpid()


def open_by_path(worker_id: int) -> None:
    """``worker_init_fn``: open the store by its path in this DataLoader worker."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    assert info is not None
    dataset: Any = info.dataset
    dataset.store = tsc.open_store(dataset.location)


class BuildInWorker(ByPath):
    """A dataset whose DataLoader workers get the store with ``cached()`` themselves."""

    def __init__(self, cache_dir: str, paths: list[str], log: str) -> None:
        super().__init__(cache_dir, paths)
        self.log = log


def cached_in_worker(worker_id: int) -> None:
    """``worker_init_fn``: ``cached(..., workers=2)`` inside a (daemonic) DataLoader worker."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    assert info is not None
    dataset: Any = info.dataset
    dataset.store = tsc.cached(dataset.paths, cache_dir=dataset.location,
                               loader=LoggedImages(dataset.log), workers=2, progress=False)


class CountsItsTrips:
    """A loader that logs every time it is pickled (``pickled``) or unpickled (``arrived``)."""

    loader_id = "tests.counts_its_trips/1"
    item_shape = (4,)

    def __init__(self, log: str) -> None:
        self.log = log

    def __getstate__(self) -> dict[str, str]:
        log_call(self.log, "pickled")
        return {"log": self.log}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.log = state["log"]
        log_call(self.log, "arrived")

    def __call__(self, key: str) -> np.ndarray:
        return np.full(4, int(key[1:]), np.float32)
