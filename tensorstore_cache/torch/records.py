"""Records as PyTorch tensors: an item, a batch, and how ragged fields are batched.

A :class:`~tensorstore_cache.torch.StoreDataset` over a store of records
serves the fields named in ``fields=`` (default: every field but text ones).
An item is a ``dict`` of zero-copy tensors (text: ``str``). A batch is one
gather per field (a copy), a ``dict`` with

* a fixed field: ``(B, *shape)`` (``(B,)`` for a scalar);
* a ragged field, by ``ragged=``:

  - ``"pad"`` (default): ``(B, Lmax, ...)`` padded with ``pad_value`` in every
    varying dimension (``max_len`` truncates the first), and ``<f>_len``
    (``(B,)`` int64, each row's size in its first varying dimension). Works
    with a plain ``DataLoader`` and torch's default collate.
  - ``"packed"``: the values of every row, concatenated, and ``<f>_offsets``
    (``(B + 1,)`` int32, from 0: the ``cu_seqlens`` of FlashAttention's
    variable-length kernels).
  - ``"nested"``: a ``torch.nested`` jagged tensor (a prototype in torch).

  The last two need ``collate_fn=tensorstore_cache.torch.collate`` (or
  ``ds.dataloader``): torch's default collate cannot stack them, and says so;
* a text field (named in ``fields=``): a ``list`` of ``str``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from ..format import Fixed, Ragged, Text
from ..reader import CacheStore, view_of

__all__ = ["RaggedMode", "check_fields", "record_batch", "record_item", "record_samples"]

RaggedMode = Literal["pad", "packed", "nested"]
"""How a batch holds a ragged field (see this module)."""


def check_fields(store: CacheStore, fields: Sequence[str] | None) -> tuple[str, ...]:
    """The fields a dataset of ``store`` serves: ``fields``, or every field but text ones.

    Raises
    ------
    KeyError
        If a field is not in the store.
    """
    schema = dict(store.spec.schema)
    if fields is None:
        return tuple(name for name, f in schema.items() if not isinstance(f, Text))
    chosen = tuple(fields)
    for name in chosen:
        if name not in schema:
            raise KeyError(f"the store has no field {name!r}; its fields are {list(schema)}")
    return chosen


def record_item(store: CacheStore, row: int, fields: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``row`` as zero-copy tensors (text as ``str``)."""
    record = view_of(store).vector(row)
    return {name: record[name] if isinstance(record[name], str) else torch.from_numpy(record[name])
            for name in fields}


def _tensor(array: npt.NDArray[Any], shared: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.share_memory_() if shared else tensor  # type: ignore[no-untyped-call]


def record_batch(
    store: CacheStore,
    rows: npt.NDArray[np.int64],
    fields: tuple[str, ...],
    *,
    ragged: RaggedMode,
    pad_value: Any,
    max_len: int | None,
    shared: bool,
) -> dict[str, Any]:
    """One batch of ``rows``: one gather per field (see this module for each field's form)."""
    schema = dict(store.spec.schema)
    out: dict[str, Any] = {}
    for name in fields:
        f = schema[name]
        if isinstance(f, Text):
            out[name] = store.field(name).take(rows)
            continue
        if isinstance(f, Fixed):
            out[name] = _tensor(store.field(name).take(rows), shared)
            continue
        batch: Ragged = store.field(name).take(rows)
        assert batch.values is not None and batch.offsets is not None
        if ragged == "pad":
            out[name] = _tensor(batch.pad(value=pad_value, max_len=max_len), shared)
            lengths = batch.lengths
            out[f"{name}_len"] = _tensor(
                lengths if max_len is None else np.minimum(lengths, max_len), shared)
        elif ragged == "packed":
            if batch.shapes is not None:
                raise TypeError(
                    f"ragged='packed' holds fields that vary in their first dimension only; "
                    f"{name!r} has shape {f.shape}: use ragged='pad'"
                )
            if int(batch.offsets[-1]) >= 2**31:
                raise ValueError(
                    f"a batch of {int(batch.offsets[-1]):,} values of {name!r} passes int32 "
                    "offsets (cu_seqlens); use smaller batches"
                )
            out[name] = _tensor(batch.values, shared)
            out[f"{name}_offsets"] = _tensor(batch.offsets.astype(np.int32), shared)
        else:
            if batch.shapes is not None:
                raise TypeError(
                    f"ragged='nested' holds fields that vary in their first dimension only; "
                    f"{name!r} has shape {f.shape}: use ragged='pad' or 'packed'"
                )
            out[name] = torch.nested.nested_tensor_from_jagged(
                torch.from_numpy(batch.values), torch.from_numpy(batch.offsets))
    return out


class _NeedsCollate(Sequence[Any]):
    """A sample of a batch only :func:`~tensorstore_cache.torch.collate` can batch.

    torch offers no public way to teach its default collate a type (its
    registry lives in a private module); it takes a value of a type it does
    not know for a sequence and asks for its length first, which raises here
    the :class:`TypeError` that says what to do.
    """

    __slots__ = ("mode",)

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def _refuse(self) -> TypeError:
        return TypeError(
            f"ragged={self.mode!r} batches are made whole by the dataset: pass "
            "collate_fn=tensorstore_cache.torch.collate to the DataLoader (or use "
            "ds.dataloader(...)), or ragged='pad', which torch's default collate stacks"
        )

    def __len__(self) -> int:
        raise self._refuse()

    def __getitem__(self, index: Any) -> Any:
        raise self._refuse()


def record_samples(
    batch: dict[str, Any], n: int, ragged: RaggedMode, ragged_fields: Sequence[str]
) -> list[dict[str, Any]]:
    """The ``n`` samples of a batch, as torch's default collate expects them.

    Padded fields are padded to the batch's largest row, so the default
    collate stacks them back into the batch; packed and nested fields
    (``ragged_fields``) cannot be split that way: their samples hold a marker
    that makes the default collate raise, saying to use
    :func:`~tensorstore_cache.torch.collate`.
    """
    whole = set() if ragged == "pad" else {*ragged_fields, *(f"{f}_offsets" for f in ragged_fields)}
    samples: list[dict[str, Any]] = [{} for _ in range(n)]
    for name, value in batch.items():
        parts: Sequence[Any]
        if name in whole:
            parts = [_NeedsCollate(ragged)] * n
        elif isinstance(value, list):
            parts = value
        else:
            parts = value.unbind(0)
        for sample, part in zip(samples, parts, strict=True):
            sample[name] = part
    return samples
