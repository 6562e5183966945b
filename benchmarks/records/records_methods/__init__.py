"""The methods of the records benchmark, and the environment each runs in.

Each method is a module of this package with a ``METHOD`` (:class:`._base.RecordMethod`),
imported only in the process that runs it: the peers' libraries live in their own
virtual environments (``make peers``), whose ``numpy``, ``torch`` and ``torchvision``
differ from this project's:

- ``project``: this project's ``.venv`` (tensorstore_cache, the numpy limit);
- ``peers``: ``.venv-peers``, torch 2.13.0 CPU as here, no torchvision (Hugging Face
  datasets, litData);
- ``peers_mds``: ``.venv-peers-mds`` for MosaicML streaming, which imports torchvision
  (``import streaming`` imports ``streaming.vision``) and caps numpy below 2.2;
- ``peers_lance``: ``.venv-peers-lance`` for Lance (pylance), with its own pyarrow and
  numpy and no torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._base import RecordMethod


@dataclass(frozen=True, slots=True)
class Entry:
    """Where a method's code is and which environment runs it."""

    module: str
    env: str
    attribute: str = "METHOD"


#: the methods, in table order
METHODS: dict[str, Entry] = {
    "tensorstore_cache": Entry("tsc", "project"),
    "hf_datasets": Entry("hf", "peers"),
    "litdata": Entry("lit", "peers"),
    "mosaicml_streaming": Entry("mds", "peers_mds"),
    "lance": Entry("lance", "peers_lance"),
    "numpy_limit": Entry("numpy_limit", "project"),
    "hf_datasets_array3d": Entry("hf", "peers", "METHOD_ARRAY3D"),
    "decode_floor": Entry("floor", "project"),
}
#: what a run measures unless told otherwise (``hf_datasets_array3d``: on request;
#: ``decode_floor``, which builds nothing to read, only in the rounds of builds)
DEFAULT = ("tensorstore_cache", "hf_datasets", "litdata", "mosaicml_streaming", "lance",
           "numpy_limit")
#: the environments' virtual environment directories, relative to the repository
VENVS = {"peers": ".venv-peers", "peers_mds": ".venv-peers-mds",
         "peers_lance": ".venv-peers-lance"}
PEERS = ("hf_datasets", "litdata", "mosaicml_streaming", "lance")
#: the decode-only floor of a build (:mod:`.floor`)
FLOOR = "decode_floor"


def get(name: str) -> RecordMethod:
    """Import the method ``name`` (in the process that will run it)."""
    try:
        entry = METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(METHODS)}") from None
    module = importlib.import_module(f"{__name__}.{entry.module}")
    method: RecordMethod = getattr(module, entry.attribute)
    return method
