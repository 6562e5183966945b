"""The embedding model of ``benchmarks.embed``: a fixed, seeded 4-conv CNN over 64x64 covers.

:func:`decode` turns a cover into ``(3, 64, 64)`` uint8 pixels (the CPU stage,
``prepare=``); :class:`CoverEmbed` is the batch loader that runs the model
(``setup`` builds it on its device, ``__call__`` embeds a batch into 128
floats per cover). :func:`embed` runs the model directly, for comparison.
torch is imported by ``setup`` and :func:`make_model` only, so that a process
that merely holds a :class:`CoverEmbed` never loads it.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

import tensorstore_cache as tsc

SIZE = 64
"""Side of the square input, in pixels."""
DIM = 128
"""Length of an embedding."""
SEED = 0
"""The seed of the model's weights."""
LOADER_ID = "benchmarks.cover-cnn64/1"
"""What :func:`decode` and :class:`CoverEmbed` compute together."""


def decode(path: str) -> npt.NDArray[np.uint8]:
    """A cover as ``(3, 64, 64)`` uint8 RGB pixels (bilinear resize)."""
    with Image.open(path) as img:
        rgb = img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1))


def make_model(device: str = "cpu") -> Any:
    """The CNN with its seeded weights, in eval mode, on ``device``: 4 convolutions of
    stride 2 (3 -> 16 -> 32 -> 64 -> 128 channels, 64 -> 4 pixels), a global average
    and a linear layer to 128."""
    import torch
    from torch import nn

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(SEED)
    try:
        layers: list[nn.Module] = []
        channels = [3, 16, 32, 64, 128]
        for cin, cout in itertools.pairwise(channels):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU()]
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, DIM))
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(device).eval()


def forward(model: Any, items: list[npt.NDArray[np.uint8]], device: str) -> npt.NDArray[np.float32]:
    """The embeddings of a batch of decoded covers."""
    import torch

    with torch.inference_mode():
        x = torch.from_numpy(np.stack(items)).to(device).float().div_(255.0)
        out: npt.NDArray[np.float32] = model(x).cpu().numpy()
    return out


def embed(paths: list[str], batch_size: int = 256) -> npt.NDArray[np.float32]:
    """The embeddings of ``paths``, computed directly in this process."""
    model = make_model()
    parts = [forward(model, [decode(p) for p in paths[i : i + batch_size]], "cpu")
             for i in range(0, len(paths), batch_size)]
    return np.concatenate(parts) if parts else np.empty((0, DIM), np.float32)


def _threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class PerItem:
    """The same embedding as a loader of one path (today's per-item API): each worker
    process builds the model at its first call."""

    loader_id = LOADER_ID + "+per-item"

    def __init__(self, threads: int | None = None, **batching: Any) -> None:
        super().__init__(**batching)
        self.threads = threads
        self.model: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "model": None}

    def __call__(self, path: str) -> npt.NDArray[np.float32]:
        """The embedding of one cover."""
        if self.model is None:
            _threads(self.threads)
            self.model = make_model()
        out: npt.NDArray[np.float32] = forward(self.model, [decode(path)], "cpu")[0]
        return out


_HF_MODEL: Any = None


def hf_embed(batch: dict[str, list[str]], threads: int | None = None) -> dict[str, Any]:
    """The function of Hugging Face ``datasets.map(batched=True)``: decode and embed a batch
    of paths (each process builds the model at its first batch)."""
    global _HF_MODEL
    if _HF_MODEL is None:
        _threads(threads)
        _HF_MODEL = make_model()
    return {"emb": forward(_HF_MODEL, [decode(p) for p in batch["path"]], "cpu")}


class CoverEmbed(tsc.BatchLoader):
    """The CNN as a batch loader: items are :func:`decode`'s pixels (``CoverEmbed(prepare=decode)``).

    ``threads`` caps the device worker's torch threads (None: torch's default).
    """

    loader_id = LOADER_ID

    def __init__(self, threads: int | None = None, **batching: Any) -> None:
        super().__init__(**batching)
        self.threads = threads
        self.model: Any = None

    def setup(self, device: str) -> None:
        """Build the model on ``device``."""
        _threads(self.threads)
        self.model = make_model(device)

    def __call__(self, items: list[Any]) -> npt.NDArray[np.float32]:
        """Embed a batch of decoded covers."""
        return forward(self.model, items, self.device)
