"""A budget of mapped files: the files of one array mapped at once, least recently used out.

A store whose files are fetched on demand gets from its
:class:`~tensorstore_cache.reader.supply.ShardSupply` a ``budget``: the most
files a segment keeps mapped at once. The arrays of the segment share it, each
keeping at most ``budget // share`` of its own files mapped (at least one).
:class:`MappedBudget` is that mechanism for one array (the shards of a fixed
field, the chunks of values of a ragged one): a read first maps the files it
needs (asked of the supply outside the lock, one hold of each kept while it is
mapped), runs under the array's lock, and then the least recently used files
beyond the budget are unmapped and given back to the supply. A read of more
files than the budget is made in groups (:meth:`MappedBudget.groups`).

The array keeps its mapped files; the budget only decides which ones are
mapped, through the three functions it is given.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from .supply import ShardSupply

__all__ = ["MappedBudget"]


@dataclass(eq=False)
class MappedBudget:
    """At most ``limit`` files of one array mapped at once, least recently used unmapped first.

    Parameters
    ----------
    supply
        Makes files present before they are mapped; every file mapped holds
        one :meth:`~ShardSupply.ensure` of it, given back
        (:meth:`~ShardSupply.release`) when it is unmapped.
    first
        The supply's id of the array's file 0 (file ``k`` is ``first + k``).
    limit
        Most files mapped at once (at least one).
    lock
        The array's lock, held while files are mapped, read and unmapped.
    is_mapped
        Whether file ``k`` is mapped (also called without the lock).
    map_file
        Maps file ``k`` (under the lock; it may raise).
    unmap_file
        Unmaps file ``k`` (under the lock).
    """

    supply: ShardSupply
    _: KW_ONLY
    first: int
    limit: int
    lock: threading.Lock
    is_mapped: Callable[[int], bool]
    map_file: Callable[[int], None]
    unmap_file: Callable[[int], None]
    _used: OrderedDict[int, None] = field(default_factory=OrderedDict, init=False)
    """The mapped files, least recently used first."""

    @classmethod
    def of(
        cls,
        supply: ShardSupply | None,
        *,
        share: int,
        first: int,
        lock: threading.Lock,
        is_mapped: Callable[[int], bool],
        map_file: Callable[[int], None],
        unmap_file: Callable[[int], None],
    ) -> MappedBudget | None:
        """The budget of an array among ``share`` arrays of a segment (None: no budget).

        Returns None when there is no supply or its ``budget`` is None (files
        then stay mapped until the array is closed); otherwise a budget of
        ``supply.budget // share`` files (at least one).
        """
        budget = None if supply is None else supply.budget
        if supply is None or budget is None:
            return None
        return cls(supply, first=first, limit=max(1, int(budget) // max(1, share)), lock=lock,
                   is_mapped=is_mapped, map_file=map_file, unmap_file=unmap_file)

    def with_mapped(self, ks: Sequence[int], read: Callable[[], None]) -> None:
        """Run ``read`` under the lock while every file of ``ks`` is mapped.

        Downloads happen outside the lock; files another thread unmapped
        meanwhile are asked for again. Afterwards the least recently used
        files beyond the budget (not those of ``ks``) are unmapped and given
        back to the supply. When a file fails to map, the holds of it and
        of the files after it are given back before the error propagates;
        the files mapped before it are kept, within the budget.
        """
        supply, first = self.supply, self.first
        is_mapped = self.is_mapped
        while True:
            missing = [k for k in ks if not is_mapped(k)]
            if missing:
                supply.ensure([first + k for k in missing])  # one hold each, kept while mapped
            with self.lock:
                for i, k in enumerate(missing):
                    if not is_mapped(k):
                        try:
                            self.map_file(k)
                        except BaseException:
                            for rest in missing[i:]:  # holds no mapping took
                                supply.release(first + rest)
                            self._trim(keep=())  # reads that keep failing stay in budget
                            raise
                        self._used[k] = None  # mapped: in the order from now on
                    else:  # another thread mapped it meanwhile: our hold is one too many
                        supply.release(first + k)
                if not all(is_mapped(k) for k in ks):
                    continue  # unmapped by another thread before we locked: again
                for k in ks:
                    self._used[k] = None
                    self._used.move_to_end(k)
                read()
                self._trim(keep=ks)
                return

    def _trim(self, keep: Sequence[int]) -> None:
        """Unmap least recently used files beyond the budget, not those of ``keep`` (under
        the lock)."""
        used = self._used
        if len(used) <= self.limit:
            return
        kept = set(keep)
        for k in list(used):
            if len(used) <= self.limit:
                return
            if k in kept:
                continue
            del used[k]
            self.unmap_file(k)
            self.supply.release(self.first + k)

    def touch(self, k: int) -> None:
        """Mapped file ``k`` was just read (under the lock); a file mapped outside the
        budget (``map_all``) enters it here."""
        self._used[k] = None
        self._used.move_to_end(k)

    def groups(self, ks: list[int]) -> list[list[int]]:
        """``ks`` cut in groups of at most the budget, in order: one read each."""
        limit = self.limit
        return [ks[at : at + limit] for at in range(0, len(ks), limit)]

    def clear(self) -> None:
        """Forget every file (the array is closed: it dropped its mappings)."""
        self._used.clear()
