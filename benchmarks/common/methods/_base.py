"""The interface every benchmarked caching method implements.

A method is driven in two places:

- the *driver* (``benchmarks.run``) calls :meth:`Method.prepare` once per work
  directory (start a manager, clear old files) and :meth:`Method.teardown` at the end;
- each *agent* (a fresh spawned process, like a sweep agent) calls :meth:`Method.load`
  with the unique image paths. ``load`` is what a user's training script would do: use
  the cache if it is there, otherwise compute every vector (with the same
  :class:`~tensorstore_cache.loaders.ImageLoader`) and fill the cache. It returns a
  :class:`Column`: the agent's handle on one ``(3, 32, 32)`` float32 vector per path.

Rows passed to :meth:`Column.batch` and :meth:`Column.item` are positions in the
agent's ``paths`` list; each method maps them to its own storage order once, in ``load``.
"""

from __future__ import annotations

import hashlib
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common._disk import dir_bytes

SIZE = (32, 32)
ITEM_SHAPE = (3, 32, 32)
ITEM_BYTES = 3 * 32 * 32 * 4
PASS_BATCH = 64  # rows per read in a full pass (768 KiB of float32)


def default_loader() -> Any:
    """The decode function every method uses: the seed's pipeline, crash-free."""
    from tensorstore_cache.loaders import ImageLoader

    return ImageLoader(SIZE)


class SyntheticLoader:
    """Picklable stand-in loader: a random vector per path, no file is read.

    Used to write stores of many items quickly for the open-time-versus-N measurement
    (open and load times do not depend on pixel values). The paths need not exist.
    """

    loader_id = "benchmarks.synthetic/1"

    @property
    def params(self) -> dict[str, object]:
        return {"size": list(SIZE), "dtype": "float32"}

    @property
    def item_shape(self) -> tuple[int, int, int]:
        return ITEM_SHAPE

    def __call__(self, path: str | os.PathLike[str]) -> np.ndarray:
        digest = hashlib.blake2b(os.fsencode(path), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return rng.random(ITEM_SHAPE, dtype=np.float32)


class Column(ABC):
    """An agent's handle on the vector of every path it asked for."""

    #: seconds spent opening / loading the cache inside ``load`` (None: no cache)
    open_s: float | None = None
    #: True if ``load`` found the cache in place (False: it computed the vectors)
    hit: bool = False

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.n = len(paths)

    @abstractmethod
    def lookup(self, path: str) -> Any:
        """The vector of one path, as a user would fetch it from this cache."""

    @abstractmethod
    def batch(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of ``paths[rows]``, as one ``(B, 3, 32, 32)`` float32 array."""

    def item(self, i: int) -> Any:
        """The vector of ``paths[i]`` (what a torch ``Dataset.__getitem__`` returns)."""
        return self.lookup(self.paths[i])

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        """Read every vector once, in row order; return the sum (keeps the work real).

        Batches are small so that the pass itself adds little private memory to the
        agent's figure: what is measured is the memory of holding the column.
        """
        total = 0.0
        for start in range(0, self.n, batch_size):
            rows = np.arange(start, min(start + batch_size, self.n))
            total += float(self.batch(rows).sum(dtype=np.float64))
        return total

    def dataset(self) -> Any:
        """A map-style torch Dataset over this column (item ``i`` is ``paths[i]``)."""
        return ColumnDataset(self)

    def dataloader(self, batch_size: int, num_workers: int, context: Any) -> Any:
        """A shuffling torch DataLoader over :meth:`dataset`.

        The default dataset has ``__getitems__``: a DataLoader fetches each batch of
        indices with one :meth:`batch` call, the fastest path every method has.
        """
        from torch.utils.data import DataLoader

        return DataLoader(self.dataset(), batch_size=batch_size, shuffle=True,
                          num_workers=num_workers, multiprocessing_context=context,
                          collate_fn=collate_array)

    def close(self) -> None:
        """Release files and connections."""
        return None


class ColumnDataset:
    """Minimal map-style Dataset: ``ds[i]`` is ``column.item(i)``; a batch of indices
    is fetched with one ``column.batch(indices)`` (``__getitems__``)."""

    def __init__(self, column: Column) -> None:
        self.column = column

    def __len__(self) -> int:
        return self.column.n

    def __getitem__(self, i: int) -> Any:
        return self.column.item(int(i))

    def __getitems__(self, indices: list[int]) -> np.ndarray:
        return self.column.batch(np.asarray(indices, dtype=np.int64))


def collate_array(batch: Any) -> Any:
    """Collate for ``__getitems__`` datasets: a gathered array becomes a tensor as is."""
    import torch
    from torch.utils.data import default_collate

    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch)
    return default_collate(batch)


class Method(ABC):
    """One way of getting cached vectors into many agent processes."""

    name: str = ""
    #: one line, for the results table
    summary: str = ""
    #: whether ``load(..., loader=SyntheticLoader())`` can write a large store quickly
    synthetic: bool = True
    #: libraries an agent of this method imports before it starts (not timed)
    modules: tuple[str, ...] = ()
    #: seconds its rounds' agents may run, if it sets its own (None: ``--agent-timeout``)
    agent_timeout_s: float | None = None

    @abstractmethod
    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        """Driver side: start from an empty cache in ``workdir``; return a picklable state."""

    def teardown(self) -> None:
        """Driver side: stop anything ``prepare`` started."""
        return None

    @abstractmethod
    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        """Agent side: return the column of ``paths``, from the cache or computed."""

    def disk_bytes(self, state: dict[str, Any]) -> int | None:
        """Bytes the cache occupies on disk (None: the method keeps nothing on disk)."""
        cache = state.get("cache_dir")
        return dir_bytes(cache) if cache else None

    def server_pids(self, state: dict[str, Any]) -> list[int]:
        """Processes other than the agents that hold cached data (a manager)."""
        return []


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn`` and return ``(result, seconds)``."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
