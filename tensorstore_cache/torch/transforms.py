"""Random augmentation of whole batches, vectorised: flips, crops, brightness and contrast.

The store holds the deterministic part of preprocessing (decode, resize);
the random part runs live, once per gathered batch, as a ``batch_transform``
of :meth:`StoreDataset.dataloader`. Each transform here takes a ``(B, C, H, W)``
batch (``uint8`` or floating point) and draws its random numbers *per
sample* from the ``generator`` it is given, so the loader can seed it per
``(seed, epoch, step)``: a resumed run augments exactly as the first one did.

Any callable on a batch tensor works as a ``batch_transform``; one that
accepts a ``generator`` keyword gets a seeded ``torch.Generator``, any other
runs inside ``torch.random.fork_rng()`` with torch's global RNG seeded.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "ColorJitter",
    "Compose",
    "RandomCrop",
    "RandomFlipCrop",
    "RandomHorizontalFlip",
    "accepts_generator",
    "apply_seeded",
    "to_float32",
]

BatchTransform = Callable[..., torch.Tensor]


def accepts_generator(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a ``generator`` keyword argument (named in its signature)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    p = params.get("generator")
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def apply_seeded(fn: BatchTransform, x: torch.Tensor, seed: int, takes_generator: bool) -> Any:
    """``fn(x, generator=g)`` with ``g`` seeded by ``seed``, else ``fn(x)`` in a seeded ``fork_rng``."""
    if takes_generator:
        return fn(x, generator=torch.Generator().manual_seed(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn(x)


def _check_batch(x: Any, who: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{who} takes a (B, C, H, W) batch tensor, got {got}")
    return x


def _bound(x: torch.Tensor) -> float:
    if x.dtype == torch.uint8:
        return 255.0
    if x.is_floating_point():
        return 1.0
    raise TypeError(f"expected a uint8 or floating-point batch, got {x.dtype}")


def to_float32(x: torch.Tensor) -> torch.Tensor:
    """``uint8`` pixels to ``float32`` in ``[0, 1]``, exactly like ``ToTensor()`` (``x / 255``).

    Bit-identical to :func:`tensorstore_cache.to_float32` (a true division,
    not a multiplication by ``1/255``).

    Parameters
    ----------
    x
        A ``uint8`` tensor of any shape.

    Returns
    -------
    torch.Tensor
        A new ``float32`` tensor.

    Examples
    --------
    >>> to_float32(torch.tensor([0, 51, 255], dtype=torch.uint8))
    tensor([0.0000, 0.2000, 1.0000])
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"to_float32 takes a uint8 tensor, got {got}")
    return x.to(torch.float32).div_(255.0)


def _flips(b: int, p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Indices of the samples to flip: each one with probability ``p``, one draw per sample."""
    return (torch.rand(b, generator=generator) < p).nonzero().squeeze(1)


def _offsets(
    b: int, room: tuple[int, int], generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample crop offsets, uniform in ``[0, room]`` along each axis."""
    dy = torch.randint(0, room[0] + 1, (b,), generator=generator)
    dx = torch.randint(0, room[1] + 1, (b,), generator=generator)
    return dy, dx


#: dtypes whose CPU batches are cropped and flipped through numpy views (faster gathers)
_NUMPY_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.bool}


def _flip_crop(
    x: torch.Tensor,
    size: tuple[int, int] | None,
    pad: int,
    fill: float,
    p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Crop each sample at a random place (``size=None``: no crop), then flip it with probability ``p``.

    The random numbers are drawn in a fixed order (flips, then offsets), so a
    seeded generator gives the same batch on every device.
    """
    b, c, h, w = x.shape
    flips = _flips(b, p, generator) if p > 0 else None
    on_numpy = x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES
    if size is None:  # a flip alone
        if on_numpy:
            a = x.detach().numpy()
            flipped = a.copy(order="C")  # never the caller's batch
            if flips is not None and len(flips):
                f = flips.numpy()
                flipped[f] = a[f, ..., ::-1]
            return torch.from_numpy(flipped)
        out = x.clone(memory_format=torch.contiguous_format)
        if flips is not None and len(flips):
            out[flips] = x[flips].flip(-1)
        return out
    ph, pw = h + 2 * pad, w + 2 * pad
    ch, cw = size
    if ch > ph or cw > pw:
        raise ValueError(f"crop size {size} is larger than the padded image ({ph}, {pw})")
    dy, dx = _offsets(b, (ph - ch, pw - cw), generator)
    if on_numpy:
        a = x.detach().numpy()
        padded = _padding_buffer((b, c, ph, pw), a.dtype, fill)
        padded[..., pad : pad + h, pad : pad + w] = a
        sb, sc, sh, sw = padded.strides
        windows = np.lib.stride_tricks.as_strided(
            padded, (b, c, ph - ch + 1, pw - cw + 1, ch, cw), (sb, sc, sh, sw, sh, sw)
        )
        crops = windows[np.arange(b), :, dy.numpy(), dx.numpy()]  # a new array
        if flips is not None and len(flips):
            f = flips.numpy()
            crops[f] = crops[f, ..., ::-1]
        return torch.from_numpy(crops)
    padded_t = x.new_full((b, c, ph, pw), fill)
    padded_t[..., pad : pad + h, pad : pad + w] = x
    tb, tc, th, tw = padded_t.stride()
    windows_t = padded_t.as_strided((b, c, ph - ch + 1, pw - cw + 1, ch, cw), (tb, tc, th, tw, th, tw))
    out = windows_t[torch.arange(b, device=x.device), :, dy.to(x.device), dx.to(x.device)]
    if flips is not None and len(flips):
        flips = flips.to(x.device)
        out[flips] = out[flips].flip(-1)
    return out


_buffers = threading.local()


def _padding_buffer(shape: tuple[int, ...], dtype: np.dtype[Any], fill: float) -> npt.NDArray[Any]:
    """This thread's padded batch of ``shape``, its border set to ``fill``, kept between batches.

    Only the centre is written per batch, and no fresh pages are faulted in.
    """
    key = (shape, dtype, fill)
    cached = getattr(_buffers, "padded", None)
    if cached is None or cached[0] != key:
        cached = (key, np.full(shape, fill, dtype=dtype))
        _buffers.padded = cached
    buffer: npt.NDArray[Any] = cached[1]
    return buffer


def _size(size: int | Sequence[int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size!r}")
    return (int(size[0]), int(size[1]))


def _check_p(p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    return float(p)


class RandomHorizontalFlip:
    """Flip each sample left-right with probability ``p`` (one draw per sample).

    Parameters
    ----------
    p
        Probability that a sample is flipped.

    Examples
    --------
    >>> x = torch.arange(8, dtype=torch.uint8).reshape(2, 1, 2, 2)
    >>> RandomHorizontalFlip(p=1.0)(x)[0, 0].tolist()
    [[1, 0], [3, 2]]
    """

    def __init__(self, p: float = 0.5) -> None:
        self.p = _check_p(p)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return a new batch with the chosen samples flipped."""
        x = _check_batch(x, "RandomHorizontalFlip")
        return _flip_crop(x, None, 0, 0, self.p, generator)


class RandomCrop:
    """Pad each sample by ``pad`` pixels and crop ``size`` at a random place (per sample).

    Parameters
    ----------
    size
        ``(height, width)`` of the crops, or one int for both. Default: the
        input's size (the usual "pad 4, crop 32" of CIFAR).
    pad
        Pixels of ``fill`` added on every side before cropping.
    fill
        Value of the padding.

    Examples
    --------
    >>> x = torch.ones(4, 3, 8, 8, dtype=torch.uint8)
    >>> RandomCrop(pad=2)(x, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([4, 3, 8, 8])
    """

    def __init__(self, size: int | Sequence[int] | None = None, *, pad: int = 4, fill: float = 0) -> None:
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        self.size = _size(size)
        self.pad = int(pad)
        self.fill = fill

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, pad={self.pad}, fill={self.fill})"

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return a new batch of crops."""
        x = _check_batch(x, "RandomCrop")
        size = self.size or (x.shape[2], x.shape[3])
        return _flip_crop(x, size, self.pad, self.fill, 0.0, generator)


class RandomFlipCrop:
    """:class:`RandomCrop` then :class:`RandomHorizontalFlip` in one pass: the CIFAR augmentation.

    Each sample is cropped at a uniformly random place of its padded image
    and flipped with probability ``p``, both drawn per sample.

    Parameters
    ----------
    size, pad, fill
        As for :class:`RandomCrop`.
    p
        Probability of a flip, per sample.

    Examples
    --------
    >>> x = torch.zeros(16, 3, 32, 32, dtype=torch.uint8)
    >>> RandomFlipCrop(pad=4)(x, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([16, 3, 32, 32])
    """

    def __init__(
        self, size: int | Sequence[int] | None = None, *, pad: int = 4, fill: float = 0, p: float = 0.5
    ) -> None:
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        self.size = _size(size)
        self.pad = int(pad)
        self.fill = fill
        self.p = _check_p(p)

    def __repr__(self) -> str:
        return f"RandomFlipCrop(size={self.size}, pad={self.pad}, fill={self.fill}, p={self.p})"

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return a new batch, cropped and flipped."""
        x = _check_batch(x, "RandomFlipCrop")
        size = self.size or (x.shape[2], x.shape[3])
        return _flip_crop(x, size, self.pad, self.fill, self.p, generator)


def _factors(b: int, amount: float, generator: torch.Generator | None) -> torch.Tensor:
    """Per-sample factors uniform in ``[1 - amount, 1 + amount]``, shaped ``(B, 1, 1, 1)``."""
    u = torch.rand(b, generator=generator, dtype=torch.float32)
    return (1.0 - amount + 2.0 * amount * u).view(b, 1, 1, 1)


_GRAY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL and torchvision


class ColorJitter:
    """Random brightness then contrast, one factor of each per sample.

    Brightness multiplies a sample by ``b``; contrast blends it with the mean
    of its grayscale image: ``mean + c * (x - mean)``; ``b`` and ``c`` are
    uniform in ``[1 - brightness, 1 + brightness]`` and ``[1 - contrast, 1 + contrast]``.
    Values are clamped to the dtype's range (``[0, 255]`` for ``uint8``,
    rounded; ``[0, 1]`` for floats).

    Parameters
    ----------
    brightness, contrast
        How far each factor may go from 1 (``0`` disables it).

    Examples
    --------
    >>> x = torch.full((2, 3, 4, 4), 100, dtype=torch.uint8)
    >>> y = ColorJitter(brightness=0.5, contrast=0.0)(x, generator=torch.Generator().manual_seed(0))
    >>> y.dtype, y.shape, bool((y[0] == y[0, 0, 0, 0]).all())
    (torch.uint8, torch.Size([2, 3, 4, 4]), True)
    """

    def __init__(self, brightness: float = 0.2, contrast: float = 0.2) -> None:
        for name, v in (("brightness", brightness), ("contrast", contrast)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        self.brightness = float(brightness)
        self.contrast = float(contrast)

    def __repr__(self) -> str:
        return f"ColorJitter(brightness={self.brightness}, contrast={self.contrast})"

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return a new batch of the same dtype with jittered brightness and contrast."""
        x = _check_batch(x, "ColorJitter")
        top = _bound(x)
        b = x.shape[0]
        brightness = _factors(b, self.brightness, generator)
        contrast = _factors(b, self.contrast, generator)
        if x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES:  # numpy: fewer passes over memory
            a = x.detach().numpy()
            y = a.astype(np.float32)
            y *= brightness.numpy()
            np.clip(y, 0.0, top, out=y)
            if a.shape[1] == 3:
                mean = np.einsum("bchw,c->b", y, np.asarray(_GRAY, dtype=np.float32))
            else:
                mean = y.sum(axis=(1, 2, 3))
            mean = (mean / (a.shape[2] * a.shape[3] * (1 if a.shape[1] == 3 else a.shape[1])))
            mean = mean.astype(np.float32).reshape(b, 1, 1, 1)
            y -= mean
            y *= contrast.numpy()
            y += mean
            np.clip(y, 0.0, top, out=y)
            if a.dtype == np.uint8:
                np.rint(y, out=y)
            return torch.from_numpy(y.astype(a.dtype))
        t = x.to(torch.float32) * brightness.to(x.device)
        t.clamp_(0.0, top)
        if x.shape[1] == 3:
            gray = torch.tensor(_GRAY, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
            tmean = (t * gray).sum(1, keepdim=True).mean((2, 3), keepdim=True)
        else:
            tmean = t.mean((1, 2, 3), keepdim=True)
        t.sub_(tmean).mul_(contrast.to(x.device)).add_(tmean).clamp_(0.0, top)
        if x.dtype == torch.uint8:
            t.round_()
        return t.to(x.dtype)


class Compose:
    """Apply batch transforms in order, handing each one the same generator.

    A member that takes no ``generator`` runs inside ``torch.random.fork_rng()``
    with torch's global RNG seeded from the generator, so the whole chain
    stays reproducible.

    Parameters
    ----------
    transforms
        Callables on a batch tensor.

    Examples
    --------
    >>> t = Compose([RandomFlipCrop(pad=4), ColorJitter(0.2, 0.2), to_float32])
    >>> t(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), generator=torch.Generator().manual_seed(0)).dtype
    torch.float32
    """

    def __init__(self, transforms: Sequence[BatchTransform]) -> None:
        self.transforms = list(transforms)
        self._takes = [accepts_generator(t) for t in self.transforms]

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return ``x`` after every transform."""
        for t, takes in zip(self.transforms, self._takes, strict=True):
            if takes:
                x = t(x, generator=generator)
            elif generator is None or t is to_float32:
                x = t(x)
            else:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                x = apply_seeded(t, x, seed, takes_generator=False)
        return x
