"""How to build: :class:`BuildOptions`, the options of one build."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from .. import config
from ..config import OnError, SourceCheck
from ..fs import EXPLICIT, Trust
from ..loaders import LoaderInfo
from .records import Schema

__all__ = ["BuildOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """How to build: the options of one ``build_store`` (or of a cache's build)."""

    loader: LoaderInfo
    """What computes the vectors, and its identity."""
    dtype: str = "float32"
    """Element type stored."""
    workers: int | None = None
    """Worker processes (None: every core)."""
    on_error: OnError = "raise"
    """``"raise"``: publish nothing if a source fails; ``"skip"``: build the rest."""
    progress: bool = True
    """Show a progress bar."""
    label: str | None = None
    """What the progress bar says is built (default: ``building <target's name>``)."""
    overwrite: bool = False
    """Replace an existing store at the target."""
    executor: Executor | None = None
    """Runs the shard tasks instead of a local process pool."""
    trust: Trust = EXPLICIT
    """Whose store it is: the modes of every directory and file created (a cache's
    private or shared modes; a path the user names: the umask's)."""
    shard_bytes: int = config.SHARD_BYTES
    """Target size of one shard file."""
    identity: SourceCheck = "stat"
    """What is recorded about each source: its stat, its stat and content hash taken before
    it is read (``"content"``; racily clean sources get a hash anyway, see
    :mod:`tensorstore_cache.fs.sources`), nothing, or its version token."""
    tokens: Mapping[str, int] | None = None
    """With ``identity="token"``: every key's version token (uint64)."""
    schema: Schema | None = None
    """The fields of a store of records, declared (or those its cache holds): each record is
    checked against them. None: one tensor per key, unless the loader returns records (a dict,
    or a tuple with ``names``), whose schema is then inferred from the first."""
    names: tuple[str, ...] | None = None
    """The field names of a loader's tuples, in order."""
    batch_size: int = 256
    """A :class:`~tensorstore_cache.loaders.BatchLoader`'s items per batch."""
    prepare: Callable[[str], Any] | None = None
    """A batch loader's per-key stage, run in the CPU workers (None: the items are the keys)."""
    devices: tuple[str, ...] = ("cpu",)
    """A batch loader's distinct devices: one device worker each."""
