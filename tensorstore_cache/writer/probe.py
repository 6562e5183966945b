"""The probe: the first items computed, when they must tell what the loader returns.

When neither ``fields=`` nor the loader's ``item_shape`` says what a loader
returns, the build computes items until one succeeds: a record (a dict, or
a tuple with ``names``) gives the schema inferred from it, a tensor its
shape. A loader of one key runs here on the keys in order; a batch loader
runs on its first device worker, on batches prepared here
(:func:`~.device.first_batch`). Each item is checked as it will be stored,
its source's identity taken before it is read, and kept: probing computes no
item twice. A build whose loader fails on every key fails, naming each with
its error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..loaders import Loader
from .device import DeviceStage, Pending, first_batch
from .frames import loader_frames, sources_failed
from .options import BuildOptions
from .records import Schema, check_record, infer_schema, is_record
from .tasks import Computed, Failure, SourceStat, check_item, source_identity

__all__ = ["Inferred", "Probe", "probe"]


class Inferred:
    """Checks the items computed first: the first one that passes gives the schema or shape,
    and those after it are checked against it."""

    def __init__(self, dtype: np.dtype[Any], names: tuple[str, ...] | None) -> None:
        self.dtype = dtype
        self.names = names
        self.schema: Schema | None = None
        self.shape: tuple[int, ...] | None = None

    def known(self) -> bool:
        """Whether an item gave the schema or shape."""
        return self.schema is not None or self.shape is not None

    def __call__(self, key: str, value: Any) -> Any:
        if self.schema is not None:
            return check_record(key, value, self.schema, self.names)
        if self.shape is not None:
            return check_item(value, self.dtype, self.shape)
        if self.names is not None or is_record(value):
            schema = infer_schema(key, value, self.names)
            checked = check_record(key, value, schema, self.names)
            self.schema = schema
            return checked
        item = check_item(value, self.dtype, None)
        self.shape = tuple(item.shape)
        return item


@dataclass(frozen=True, slots=True)
class Probe:
    """What the probe learnt, and the items it computed."""

    computed: Computed
    """Every item computed, by row: its value (or failure) and its source's identity."""
    pending: Pending | None
    """A batch loader's batches still being computed (see :class:`~.device.Pending`)."""
    schema: Schema | None
    """The schema the first record gave (None: the loader returns tensors)."""
    shape: tuple[int, ...] | None
    """The shape the first tensor gave."""


def probe(
    keys: list[str], options: BuildOptions, label: str, loader: Loader | DeviceStage
) -> Probe:
    """Compute items of ``keys`` until one tells what ``loader`` returns.

    Parameters
    ----------
    keys
        The build's keys, in row order (at least one).
    options
        How to build (the dtype, the field names, how sources are identified).
    label
        The build's target, named by the error.
    loader
        A loader of one key, or the stage of a batch loader's build.

    Raises
    ------
    BuildError
        If the loader fails on every key, naming each with its error.
    """
    infer = Inferred(np.dtype(options.dtype), options.names)
    tokens = options.tokens if options.identity == "token" else None

    def identify(key: str) -> SourceStat:
        return source_identity(key, options.identity, None if tokens is None else tokens[key])

    pending = None
    if isinstance(loader, DeviceStage):
        computed, pending = first_batch(loader, keys, infer, infer.known, identify,
                                        options.names)
        failed = computed  # every row, when none succeeded
    else:
        computed, failed = _first_item(loader, keys, infer, identify)
    if not infer.known():
        raise sources_failed([(keys[i], failure.reason, failure.frames)
                              for i, (failure, _identity) in sorted(failed.items())],
                             len(keys), label)
    return Probe(computed, pending, infer.schema, infer.shape)


def _first_item(
    loader: Loader, keys: list[str], check: Callable[[str, Any], Any],
    identify: Callable[[str], SourceStat],
) -> tuple[Computed, Computed]:
    """The first item ``loader`` succeeds on, by row, with its source's identity, and the
    failures before it (not kept: a key that failed is computed again by its shard task)."""
    failed: Computed = {}
    for i, key in enumerate(keys):
        identity = identify(key)
        try:
            return {i: (check(key, loader(key)), identity)}, failed
        except Exception as exc:
            failed[i] = (Failure(f"{type(exc).__name__}: {exc}", loader_frames(exc)), identity)
    return {}, failed
