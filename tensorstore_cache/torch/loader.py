"""The resumable loader: :class:`StoreLoader`, a ``DataLoader`` that counts what it hands over.

Its position is ``(epoch, consumed)``: the epoch of the next batch and the
global steps of that epoch already *handed to the training loop* (a batch
drawn from the sampler or prefetched by a worker is not counted). Each
``iter()`` asks the sampler for the batches of ``epoch`` from step
``consumed`` on; handing over the epoch's last batch moves the position to
``(epoch + 1, 0)``, once. A state loads only while no iterator of the loader
is running, so an iterator can never start from a position loaded after it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset

from .sampler import StoreSampler
from .state import LoaderState, OnChange, order_digest

__all__ = ["StoreLoader"]


class StoreLoader(DataLoader[Any]):
    """A ``DataLoader`` over a :class:`StoreDataset` with a resumable position.

    Made by :meth:`StoreDataset.dataloader`; its :attr:`sampler` is a
    :class:`StoreSampler` and each batch is gathered in one piece.

    Parameters
    ----------
    dataset
        The :class:`StoreDataset` it serves.
    sampler
        The order of the batches (a :class:`StoreSampler`).
    keys
        Gives the dataset's keys, in row order (what a saved position is checked against).
    **kwargs
        The other arguments of ``torch.utils.data.DataLoader`` (``num_workers``...);
        ``in_order`` must stay True.

    Attributes
    ----------
    sampler : StoreSampler
        The order of the batches.

    Examples
    --------
    >>> from tensorstore_cache.torch import StoreDataset, StoreSampler
    >>> ds = StoreDataset(tsc.build_store(paths, "covers.tsc", progress=False))
    >>> loader = ds.dataloader(sampler=StoreSampler(len(ds), global_batch_size=2, seed=0))
    >>> first = next(iter(loader))  # one batch handed over, then the job stops
    >>> state = loader.state_dict()
    >>> state["epoch"], state["consumed"]
    (0, 1)
    >>> resumed = ds.dataloader(sampler=StoreSampler(len(ds), global_batch_size=2, seed=0))
    >>> resumed.load_state_dict(state)  # in a new process, from a checkpoint
    >>> len(list(resumed))  # the epoch's 3 other batches
    3
    """

    sampler: StoreSampler

    def __init__(
        self,
        dataset: Dataset[Any],
        sampler: StoreSampler,
        *,
        keys: Callable[[], list[str]],
        **kwargs: Any,
    ) -> None:
        if kwargs.get("in_order", True) is not True:
            raise TypeError(
                "in_order=False hands batches over out of order, so a count of the batches "
                "handed over is no position to resume from; leave in_order=True"
            )
        super().__init__(dataset, batch_size=None, sampler=sampler, **kwargs)
        self._keys = keys
        self._digest: str | None = None
        self._epoch = sampler.epoch
        self._consumed = 0
        self._active: weakref.ref[_Iterator] | None = None

    # -- the position -----------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the next batch (it advances once, when an epoch's last batch is handed over)."""
        return self._epoch

    @property
    def consumed(self) -> int:
        """Global steps of :attr:`epoch` already handed to the training loop."""
        return self._consumed

    def _handed(self, epoch: int) -> bool:
        """Count one batch of ``epoch`` handed over; True if it ended the epoch."""
        if epoch != self._epoch:  # pragma: no cover - an iterator is tied to one epoch
            raise RuntimeError(f"a batch of epoch {epoch} was handed over during epoch {self._epoch}")
        self._consumed += 1
        if self._consumed >= self.sampler.steps_per_epoch:
            self._epoch, self._consumed = self._epoch + 1, 0
            return True
        return False

    def _running(self) -> _Iterator | None:
        it = self._active() if self._active is not None else None
        return it if it is not None and not it.finished else None

    def __iter__(self) -> _Iterator:  # type: ignore[override]
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.superseded = True  # the new iterator continues where it stopped
        sampler = self.sampler
        if sampler._user_epoch and sampler.epoch != self._epoch:
            if self._consumed:
                raise RuntimeError(
                    f"sampler.set_epoch({sampler.epoch}) in the middle of epoch {self._epoch} "
                    f"({self._consumed} of {sampler.steps_per_epoch} steps handed over): the "
                    "loader keeps its own epoch (loader.epoch); drop the set_epoch() call"
                )
            self._epoch = sampler.epoch
        sampler._resume_at(self._epoch, self._consumed)
        it = _Iterator(self, super().__iter__(), self._epoch, sampler.steps_per_epoch - self._consumed)
        self._active = weakref.ref(it)
        return it

    # -- the state ----------------------------------------------------------------

    def _current_digest(self) -> str:
        if self._digest is None:
            self._digest = order_digest(self._keys(), self.sampler.n)
        return self._digest

    def state_dict(self) -> dict[str, Any]:
        """The position, as a small JSON-serialisable dict to store in a checkpoint.

        Returns
        -------
        dict
            ``version``, ``seed``, ``epoch``, ``consumed`` (global steps of
            ``epoch`` handed to the loop: the same on every rank), ``n``,
            ``global_batch``, ``shuffle``, ``drop_last`` and ``digest`` (XXH3-64
            of the dataset's keys in order plus ``n``; computed once per loader).

        Examples
        --------
        >>> from tensorstore_cache.torch import StoreDataset
        >>> ds = StoreDataset(tsc.build_store(paths, "covers.tsc", progress=False))
        >>> loader = ds.dataloader(2, shuffle=True)
        >>> batches = list(loader)  # a whole epoch
        >>> state = loader.state_dict()
        >>> state["epoch"], state["consumed"], state["n"], state["global_batch"]
        (1, 0, 8, 2)
        """
        s = self.sampler
        return LoaderState(
            seed=s.seed,
            epoch=self._epoch,
            consumed=self._consumed,
            n=s.n,
            global_batch=s.global_batch_size,
            digest=self._current_digest(),
            shuffle=s.shuffle,
            drop_last=s.drop_last,
        ).to_dict()

    def load_state_dict(self, state: dict[str, Any], *, on_change: OnChange = "raise") -> None:
        """Continue from a state saved by :meth:`state_dict`, at any valid world size.

        Call it before iterating. The next batch is global step ``consumed``
        of ``epoch`` (a state saved after an epoch's last step loads as step 0
        of the next epoch); the state's seed replaces the sampler's.

        Parameters
        ----------
        state
            What :meth:`state_dict` returned (possibly via JSON).
        on_change
            What to do when the dataset's keys, their order or their number
            changed since the state was saved: ``"raise"`` (default) raises
            ``ValueError`` naming what changed; ``"restart_epoch"`` starts the
            state's epoch over, from its first step, with the new items.

        Raises
        ------
        RuntimeError
            If an iterator of this loader is still running (not exhausted):
            it would not see the loaded position.
        ValueError
            If the state is malformed, was saved with another
            ``global_batch_size``, ``shuffle`` or ``drop_last``, or (with
            ``on_change="raise"``) over other keys.

        Examples
        --------
        >>> import json
        >>> from tensorstore_cache.torch import StoreDataset
        >>> ds = StoreDataset(tsc.build_store(paths, "covers.tsc", progress=False))
        >>> saved = json.dumps(ds.dataloader(2).state_dict())  # as a checkpoint keeps it
        >>> loader = ds.dataloader(2)
        >>> loader.load_state_dict(json.loads(saved))
        >>> loader.epoch
        0
        """
        if on_change not in ("raise", "restart_epoch"):
            raise ValueError(f"on_change must be 'raise' or 'restart_epoch', got {on_change!r}")
        running = self._running()
        if running is not None:
            raise RuntimeError(
                "load_state_dict() while an iterator of this loader is still running: that "
                "iterator would go on from the old position; load the state before iterating "
                "(or exhaust or delete the iterator first)"
            )
        parsed = LoaderState.from_dict(state)
        s = self.sampler
        if parsed.global_batch != s.global_batch_size:
            raise ValueError(
                f"the state was saved with global_batch_size={parsed.global_batch}, this loader's "
                f"sampler has {s.global_batch_size}: global steps differ; resume with "
                f"global_batch_size={parsed.global_batch} (any world size that divides it)"
            )
        for name, saved, now in (("shuffle", parsed.shuffle, s.shuffle),
                                 ("drop_last", parsed.drop_last, s.drop_last)):
            if saved is not None and saved != now:
                raise ValueError(
                    f"the state was saved with {name}={saved}, this loader's sampler has "
                    f"{name}={now}: the order would differ; resume with {name}={saved}"
                )
        changes = []
        if parsed.n != s.n:
            changes.append(f"the number of items changed from {parsed.n} to {s.n}")
        elif parsed.digest != self._current_digest():
            changes.append(
                f"the keys or their order changed (digest {parsed.digest} when saved, "
                f"{self._current_digest()} now)"
            )
        epoch, consumed = parsed.epoch, parsed.consumed
        if changes:
            if on_change == "raise":
                raise ValueError(
                    f"cannot resume: {'; '.join(changes)} since the state was saved (epoch "
                    f"{parsed.epoch}, step {parsed.consumed}); resume over the same keys, or "
                    f"pass on_change='restart_epoch' to start epoch {parsed.epoch} over"
                )
            consumed = 0
        steps = s.steps_per_epoch
        if consumed > steps:
            raise ValueError(
                f"loader state: consumed={consumed} is more than the {steps} steps of an epoch "
                f"of {s.n} items in global batches of {s.global_batch_size}"
            )
        if consumed == steps:
            epoch, consumed = epoch + 1, 0
        s.seed = parsed.seed
        s._cached = None
        self._epoch, self._consumed = epoch, consumed
        s._resume_at(epoch, consumed)


class _Iterator(Iterator[Any]):
    """One pass of a :class:`StoreLoader`: counts each batch as it is handed over."""

    def __init__(self, loader: StoreLoader, inner: Iterator[Any], epoch: int, steps: int) -> None:
        self._loader = loader
        self._steps = steps  # batches this pass hands over
        self._inner = inner
        self._epoch = epoch
        self._ended = False  # the epoch's last batch was handed over
        self._done = False  # StopIteration was raised
        self.superseded = False
        """A newer ``iter(loader)`` took over (it continues where this one stopped)."""

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        if self._ended or self._done:
            if not (self._done or self.superseded):  # persistent workers: the inner one is shared
                self._done = True
                for _extra in self._inner:  # pragma: no cover - the sampler has no more batches
                    raise RuntimeError("the loader yielded more batches than its sampler's epoch holds")
            self._done = True
            raise StopIteration
        if self.superseded:
            raise RuntimeError(
                "this iterator was replaced by a newer iter() of its loader, which continues "
                "the epoch where this one stopped; iterate the newer one"
            )
        try:
            batch = self._inner.__next__()
        except StopIteration:
            self._done = True
            raise
        self._ended = self._loader._handed(self._epoch)
        return batch

    @property
    def finished(self) -> bool:
        """Nothing more to hand over: the epoch's last batch was handed over, or the pass ended."""
        return self._ended or self._done

    def __len__(self) -> int:
        """Batches of this pass (the rest of the epoch when it continues one)."""
        return self._steps
