"""The order of training reads: :class:`StoreSampler`, elastic and resumable.

Epoch ``e``'s order is a permutation computed from ``(seed, e)`` by our own
arithmetic (:mod:`._random`), so it is the same on every machine and numpy
build. Global batch ``s`` is ``perm[s*G:(s+1)*G]`` and rank ``r`` of ``W``
takes the ``r``-th of its ``W`` equal slices: every world size that divides
``G`` sees the same global batches, which is what lets a job restarted on
another number of processes continue the same epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch.distributed as dist
from torch.utils.data import Sampler

from ._random import mix, permutation

__all__ = ["BatchIndices", "StoreSampler"]

_MAX_SEED = 1 << 64


class BatchIndices(list[int]):
    """The indices of one batch, with the seed of its random augmentation.

    The seed travels with the indices to whichever process gathers the
    batch, so the number of DataLoader workers never changes it.
    """

    __slots__ = ("epoch", "seed", "step")

    def __init__(self, indices: Iterable[int], *, seed: int, epoch: int, step: int) -> None:
        super().__init__(indices)
        self.seed = seed
        """Seed of this batch's ``batch_transform``, from ``(seed, epoch, step, offset)``."""
        self.epoch = epoch
        """The epoch of the batch."""
        self.step = step
        """The batch's global step within its epoch."""


def _divisors(g: int) -> list[int]:
    small = [d for d in range(1, int(g**0.5) + 1) if g % d == 0]
    return sorted({*small, *(g // d for d in small)})


def _distributed() -> tuple[int, int] | None:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < low or (high is not None and v >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {v}")
    return v


class StoreSampler(Sampler[list[int]]):
    """A batch sampler over ``n`` items whose order survives restarts and world-size changes.

    Each epoch is a permutation of ``range(n)`` computed from ``(seed, epoch)``
    by integer arithmetic (splitmix64, then a stable argsort), identical on
    every machine. Global batch ``s`` of an epoch is ``perm[s*G:(s+1)*G]``;
    rank ``r`` of ``W`` yields its ``r``-th slice of ``G / W`` indices. The
    global batches are therefore the same for every world size that divides
    ``G``, and a state saved by :meth:`StoreLoader.state_dict` at one world
    size loads at another.

    Parameters
    ----------
    n
        Number of items (``len(dataset)``); with none, an epoch has no batch.
    global_batch_size
        Items per optimisation step, summed over all ranks (``G``).
    seed
        Seed of the order and of batch transforms, in ``[0, 2**64)``.
    shuffle
        ``False`` keeps the items in order (every epoch alike).
    drop_last
        ``True`` drops the last ``n % G`` items of each epoch (a different
        set each epoch when shuffled). ``False`` keeps them as a last, smaller
        global batch split into ``W`` contiguous slices whose sizes differ by
        at most one; a tail shorter than ``W`` is padded by wrapping to the
        epoch's first rows (as ``DistributedSampler`` does), so every rank
        gets the same number of batches (a rank without a batch would hang
        DDP's collectives).
    rank, world_size
        This process's rank and the number of processes. Default: from
        ``torch.distributed`` when it is initialised, else 0 and 1.

    Raises
    ------
    ValueError
        If ``global_batch_size`` is not a multiple of ``world_size`` (the
        message lists the world sizes that work), if ``rank`` is out of
        range, or if an epoch would have no batch.

    Notes
    -----
    Used alone, as ``DataLoader(ds, batch_sampler=sampler)``, it is a plain
    stateless batch sampler: each full pass advances :attr:`epoch` by one and
    :meth:`set_epoch` chooses it. Through ``StoreDataset.dataloader(sampler=...)``
    the loader drives it and keeps a resumable state.

    Examples
    --------
    >>> s = StoreSampler(10, global_batch_size=4, seed=0, rank=1, world_size=2)
    >>> len(s), s.batch_size
    (2, 2)
    >>> [list(b) for b in s] == [list(s.global_batch(0, k)[2:]) for k in range(2)]
    True
    >>> StoreSampler(10, global_batch_size=4, world_size=3, rank=0)
    Traceback (most recent call last):
    ...
    ValueError: global_batch_size=4 is not a multiple of world_size=3: each of the 3 ranks takes global_batch_size / world_size items of every global batch; world sizes that work with global_batch_size=4: 1, 2, 4 (or choose a global_batch_size that 3 divides)
    """

    def __init__(
        self,
        n: int,
        *,
        global_batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.n = _check_int("n", n, 0)
        """Number of items."""
        self.global_batch_size = _check_int("global_batch_size", global_batch_size, 1)
        """Items per global step, all ranks together."""
        self.seed = _check_int("seed", seed, 0, _MAX_SEED)
        """Seed of the order (and of batch transforms)."""
        self.shuffle = bool(shuffle)
        """Whether each epoch is shuffled."""
        self.drop_last = bool(drop_last)
        """Whether the last ``n % global_batch_size`` items of each epoch are dropped."""
        found = _distributed()
        if world_size is None:
            world_size = found[1] if found is not None else 1
        if rank is None:
            rank = found[0] if found is not None else 0
        self.world_size = _check_int("world_size", world_size, 1)
        """Number of ranks."""
        self.rank = _check_int("rank", rank, 0)
        """This process's rank."""
        if self.rank >= self.world_size:
            raise ValueError(f"rank={self.rank} is out of range for world_size={self.world_size}")
        g, w = self.global_batch_size, self.world_size
        if g % w:
            works = ", ".join(map(str, _divisors(g)))
            raise ValueError(
                f"global_batch_size={g} is not a multiple of world_size={w}: each of the {w} ranks "
                f"takes global_batch_size / world_size items of every global batch; world sizes "
                f"that work with global_batch_size={g}: {works} (or choose a global_batch_size "
                f"that {w} divides)"
            )
        self.batch_size = g // w
        """Items per rank and step (the last, smaller step of ``drop_last=False`` aside)."""
        if self.drop_last and 0 < self.n < g:
            raise ValueError(
                f"{self.n} items make no global batch of {g} with drop_last=True; pass "
                f"drop_last=False or a global_batch_size of at most {self.n}"
            )
        self.epoch = 0
        """The epoch the next pass yields."""
        self._start = 0  # the step the next pass starts from (set by a loader)
        self._user_epoch = False  # set_epoch() was called since the loader last set the epoch
        self._cached: tuple[int, npt.NDArray[np.int64]] | None = None

    def __repr__(self) -> str:
        return (
            f"StoreSampler(n={self.n}, global_batch_size={self.global_batch_size}, "
            f"seed={self.seed}, shuffle={self.shuffle}, drop_last={self.drop_last}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )

    @property
    def steps_per_epoch(self) -> int:
        """Global steps (batches per rank) in each epoch; also ``len(sampler)``."""
        g = self.global_batch_size
        return self.n // g if self.drop_last else -(-self.n // g)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (its order and its batch-transform seeds).

        Parameters
        ----------
        epoch
            A non-negative epoch number.

        Examples
        --------
        >>> s = StoreSampler(8, global_batch_size=4)
        >>> s.set_epoch(3)
        >>> s.epoch
        3
        """
        self.epoch = _check_int("epoch", epoch, 0)
        self._start = 0
        self._user_epoch = True

    def permutation(self, epoch: int) -> npt.NDArray[np.int64]:
        """The order of ``epoch``: a permutation of ``range(n)`` (``arange`` unshuffled).

        Parameters
        ----------
        epoch
            The epoch.

        Returns
        -------
        numpy.ndarray
            ``int64`` item indices; the same on every machine for the same
            ``(seed, epoch, n)``. The last epoch's permutation is kept (read-only).

        Examples
        --------
        >>> p = StoreSampler(5, global_batch_size=1, seed=7).permutation(0)
        >>> sorted(p.tolist())
        [0, 1, 2, 3, 4]
        """
        epoch = _check_int("epoch", epoch, 0)
        cached = self._cached
        if cached is not None and cached[0] == epoch:
            return cached[1]
        if self.shuffle:
            perm = permutation(self.n, mix(self.seed, epoch))
        else:
            perm = np.arange(self.n, dtype=np.int64)
        perm.flags.writeable = False
        self._cached = (epoch, perm)
        return perm

    def _slice(self, perm: npt.NDArray[np.int64], step: int, rank: int) -> tuple[npt.NDArray[np.int64], int]:
        """Rank ``rank``'s indices of global step ``step`` and their offset in the global batch."""
        g, w = self.global_batch_size, self.world_size
        begin = step * g
        if begin + g <= self.n:
            size = g // w
            return perm[begin + rank * size : begin + (rank + 1) * size], rank * size
        tail = perm[begin:]
        if len(tail) < w:  # pad by wrapping to the epoch's first rows
            tail = np.concatenate([tail, perm[np.arange(w - len(tail)) % self.n]])
        base, extra = divmod(len(tail), w)
        start = rank * base + min(rank, extra)
        return tail[start : start + base + (rank < extra)], start

    def global_batch(self, epoch: int, step: int) -> npt.NDArray[np.int64]:
        """The item indices of global step ``step`` of ``epoch``, all ranks' slices in rank order.

        Parameters
        ----------
        epoch, step
            The epoch, and the step within it (``0 <= step < steps_per_epoch``).

        Returns
        -------
        numpy.ndarray
            ``int64`` indices; ``global_batch_size`` of them except for the
            last step with ``drop_last=False``, which may be padded to
            ``world_size`` (see the class).

        Examples
        --------
        >>> s = StoreSampler(6, global_batch_size=4, shuffle=False, drop_last=False, world_size=4, rank=0)
        >>> s.global_batch(0, 0).tolist(), s.global_batch(0, 1).tolist()
        ([0, 1, 2, 3], [4, 5, 0, 1])
        """
        step = _check_int("step", step, 0, self.steps_per_epoch)
        perm = self.permutation(epoch)
        return np.concatenate([self._slice(perm, step, r)[0] for r in range(self.world_size)])

    def batches(self, epoch: int, start: int = 0) -> Iterator[BatchIndices]:
        """This rank's batches of ``epoch`` from global step ``start`` on.

        Parameters
        ----------
        epoch
            The epoch.
        start
            The first global step to yield (resume: the steps already done).

        Yields
        ------
        BatchIndices
            A list of item indices carrying the seed of its batch transform.

        Examples
        --------
        >>> s = StoreSampler(10, global_batch_size=5, shuffle=False)
        >>> [list(b) for b in s.batches(0, start=1)]
        [[5, 6, 7, 8, 9]]
        """
        epoch = _check_int("epoch", epoch, 0)
        start = _check_int("start", start, 0, self.steps_per_epoch + 1)
        perm = self.permutation(epoch)  # computed now, not at the first next()
        return self._batches(perm, epoch, start)

    def _batches(self, perm: npt.NDArray[np.int64], epoch: int, start: int) -> Iterator[BatchIndices]:
        for step in range(start, self.steps_per_epoch):
            indices, offset = self._slice(perm, step, self.rank)
            seed = mix(self.seed, epoch, step, offset)
            yield BatchIndices(indices.tolist(), seed=seed, epoch=epoch, step=step)
        if self.epoch == epoch and self._start == start:  # a full pass: the next one is new
            self.epoch, self._start = epoch + 1, 0

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches(self.epoch, self._start)

    def _resume_at(self, epoch: int, start: int) -> None:
        """Make the next pass yield ``epoch`` from step ``start`` (the loader's position)."""
        self.epoch, self._start, self._user_epoch = epoch, start, False
