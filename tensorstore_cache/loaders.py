"""The default loader: one image file in, one ``(3, H, W)`` array out.

:class:`ImageLoader` reproduces, bit for bit, the preprocessing that
tensorstore_cache was written to cache::

    img = PIL.Image.open(path)
    img = torchvision.transforms.Resize((H, W))(img)  # img.resize((W, H), BILINEAR)
    x = torchvision.transforms.ToTensor()(img)        # uint8 HWC -> float32 CHW / 255
    if x.shape[0] == 1:
        x = x.expand(3, H, W)

for RGB and grayscale (``"L"``) images, without importing torch. For every other
Pillow mode, where that pipeline crashes (4-channel and 2-channel images) or
silently returns wrong values (palette indices instead of colours, YCbCr or HSV
bytes taken for RGB, raw 16-bit or float values outside ``[0, 1]``), the image is
converted to 8-bit RGB or L *before* resizing, by the rules below. Changing any of
these rules changes :data:`LOADER_ID`, so a store built under the old rules is not
mistaken for one built under the new.

=================================  ====================================================
Pillow mode                        Conversion before the bilinear resize
=================================  ====================================================
``RGB``, ``L``                     none (exactly the pipeline above; a ``transparency``
                                   entry in ``img.info`` is ignored, as it was there)
``1``                              none: Pillow resizes bilevel images with NEAREST
                                   whatever filter is asked for, and the pipeline above
                                   gives 0.0 or 1.0; so does this loader, identically
``P`` (palette)                    palette looked up to colours: ``convert("RGB")``, or
                                   ``convert("RGBA")`` and the alpha rule when the image
                                   has a ``transparency`` entry or an RGBA palette
``RGBA``, ``PA``, ``RGBa``         composited over a white background (alpha rule)
``LA``, ``La``                     composited over a white background, stays grey
``I;16``, ``I;16L``, ``I;16B``,    16-bit grey to 8-bit: ``v8 = round(v16 / 257)``,
``I;16N``, ``I``                   the inverse of the usual 8->16-bit expansion
                                   ``v16 = 257 * v8``; ``I`` (32-bit, which older Pillow
                                   versions used for 16-bit PNGs) is read as 16-bit
                                   data and clipped to ``[0, 65535]`` first
``F`` (32-bit float)               read as intensity in ``[0, 1]``:
                                   ``v8 = round(255 * clip(v, 0, 1))``, NaN -> 0
``CMYK``, ``YCbCr``, ``LAB``,      Pillow's ``convert("RGB")``
``HSV``, ``RGBX``, any other
=================================  ====================================================

Alpha rule: ``c' = round((c * a + 255 * (255 - a)) / 255)`` per channel, in
integers; a fully transparent pixel becomes white, a fully opaque one keeps its
colour.

EXIF orientation is *not* applied (the original pipeline did not apply it either):
a JPEG whose EXIF tag says "rotate 90 degrees" is loaded as stored.

Unreadable files: :class:`FileNotFoundError`, :class:`IsADirectoryError` and
:class:`PermissionError` propagate unchanged (their message names the path); any
decoding failure (not an image, truncated, corrupt, decompression bomb) is raised
as :class:`OSError` whose message names the path, chained to Pillow's error.
Truncated images are never half-loaded (``ImageFile.LOAD_TRUNCATED_IMAGES`` is left
alone).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "BatchLoader",
    "ImageLoader",
    "LOADER_ID",
    "Loader",
    "LoaderInfo",
    "resolve_loader",
    "to_float32",
]

Loader = Callable[[str], Any]
"""A picklable callable ``path -> array`` of one fixed shape."""

LOADER_ID: Final = "tensorstore_cache.image/1"
"""Identifier of :class:`ImageLoader`'s preprocessing rules (stored in each store)."""

_DTYPES: Final = ("float32", "uint8")
_SCALE: Final = np.float32(255)

# Modes resized as they are; everything else is first converted to one of them.
_AS_IS: Final = frozenset({"RGB", "L", "1"})
_SIXTEEN_BIT: Final = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})

# Exceptions Pillow raises for bad image data (as opposed to a bad path), with its
# DecompressionBombError (Pillow is imported at the first image read, not with the package).
_DECODE_ERRORS: Final = (
    OSError,
    SyntaxError,
    EOFError,
    ValueError,
    struct.error,
)
_PATH_ERRORS: Final = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


@dataclass(frozen=True, slots=True)
class ImageLoader:
    """Load an image file as a ``(3, H, W)`` array, as ``Resize`` + ``ToTensor`` do.

    A picklable callable, suitable for worker processes. See the module docstring
    for how images that are not RGB or grayscale are converted.

    Parameters
    ----------
    size : tuple of int, default (32, 32)
        Output ``(height, width)`` in pixels. Both must be positive integers.
    dtype : {"float32", "uint8"}, default "float32"
        ``"float32"`` gives values in ``[0, 1]``, bit-identical to torchvision's
        ``ToTensor()``. ``"uint8"`` gives the resized pixels themselves (a quarter
        of the size); :func:`to_float32` turns them into the float32 output, bit for
        bit.

    Raises
    ------
    ValueError
        If `size` or `dtype` is not valid; the message names the value.

    Examples
    --------
    >>> import os, tempfile
    >>> from PIL import Image
    >>> path = os.path.join(tempfile.mkdtemp(), "red.png")
    >>> Image.new("RGB", (150, 100), (255, 0, 0)).save(path)
    >>> loader = ImageLoader(size=(32, 32))
    >>> x = loader(path)
    >>> x.shape, x.dtype
    ((3, 32, 32), dtype('float32'))
    >>> [float(x[c, 0, 0]) for c in range(3)]
    [1.0, 0.0, 0.0]
    >>> u = ImageLoader(size=(32, 32), dtype="uint8")(path)
    >>> bool((to_float32(u) == x).all())
    True
    """

    size: tuple[int, int] = (32, 32)
    """Output ``(height, width)``."""
    dtype: str = "float32"
    """Output dtype name, ``"float32"`` or ``"uint8"``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _check_size(self.size))
        object.__setattr__(self, "dtype", _check_dtype(self.dtype))

    @property
    def loader_id(self) -> str:
        """Identifier of the preprocessing rules: ``"tensorstore_cache.image/1"``."""
        return LOADER_ID

    @property
    def params(self) -> dict[str, object]:
        """JSON-able parameters that, with :attr:`loader_id`, determine the output.

        Examples
        --------
        >>> ImageLoader(size=(64, 48), dtype="uint8").params["size"]
        [64, 48]
        """
        return {
            "size": [self.size[0], self.size[1]],
            "resample": "bilinear",
            "channels": 3,
            "dtype": self.dtype,
            "alpha": "white",
        }

    @property
    def item_shape(self) -> tuple[int, int, int]:
        """Shape of one output array, ``(3, height, width)``."""
        return (3, self.size[0], self.size[1])

    def __call__(self, path: str | os.PathLike[str]) -> npt.NDArray[Any]:
        """Decode, convert and resize the image at `path`.

        Parameters
        ----------
        path : str or os.PathLike
            Image file in any format Pillow can read.

        Returns
        -------
        numpy.ndarray
            New C-contiguous array of shape ``(3, height, width)`` and dtype
            :attr:`dtype`.

        Raises
        ------
        FileNotFoundError
            If `path` does not exist (likewise IsADirectoryError, PermissionError).
        OSError
            If the file cannot be decoded as an image; the message names `path`.
        """
        from PIL import Image  # here, not at the package's import: most processes never decode

        height, width = self.size
        try:
            with Image.open(path) as img:
                img.load()
                img8 = _to_eight_bit(img)
                resized = img8.resize((width, height), Image.Resampling.BILINEAR)
            if resized.mode == "1":
                resized = resized.convert("L")  # False/True -> 0/255
        except _PATH_ERRORS:
            raise
        except (*_DECODE_ERRORS, Image.DecompressionBombError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise OSError(f"cannot decode image {os.fspath(path)!r}: {reason}") from exc
        pixels = np.asarray(resized)
        if pixels.ndim == 2:  # grey: the same plane in each of the 3 channels
            chw = np.broadcast_to(pixels, (3, height, width))
        else:
            chw = pixels.transpose(2, 0, 1)
        if self.dtype == "uint8":
            return np.array(chw, dtype=np.uint8, order="C", copy=True)
        return to_float32(chw)


def to_float32(
    array: npt.NDArray[np.uint8], out: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.float32]:
    """Convert uint8 pixels to float32 in ``[0, 1]``, exactly like ``ToTensor()``.

    Computes ``array / 255`` in float32 (a true division, as torch's
    ``.float().div(255)``; multiplying by ``1/255`` would differ in the last bit
    for 126 of the 256 values).

    Parameters
    ----------
    array : numpy.ndarray of uint8
        Any shape, e.g. one ``(3, H, W)`` item or a ``(B, 3, H, W)`` batch.
    out : numpy.ndarray of float32, optional
        Preallocated, writeable array of the same shape to fill (no allocation).

    Returns
    -------
    numpy.ndarray of float32
        `out` if given, else a new C-contiguous array.

    Raises
    ------
    TypeError
        If `array` is not a uint8 ndarray or `out` is not a float32 ndarray.
    ValueError
        If `out` has a different shape or is read-only.

    Examples
    --------
    >>> import numpy as np
    >>> to_float32(np.array([0, 51, 255], dtype=np.uint8))
    array([0. , 0.2, 1. ], dtype=float32)
    >>> out = np.empty(3, dtype=np.float32)
    >>> to_float32(np.array([255, 0, 255], dtype=np.uint8), out=out) is out
    True
    """
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8:
        got = _describe(array)
        raise TypeError(
            f"to_float32 expects a numpy uint8 array, got {got}; "
            "float stores are already float32, use the array as it is"
        )
    if out is None:
        return np.divide(array, _SCALE, dtype=np.float32, order="C")
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        got = _describe(out)
        raise TypeError(f"to_float32 out= must be a numpy float32 array, got {got}")
    if out.shape != array.shape:
        raise ValueError(
            f"to_float32 out= has shape {out.shape}, the input has shape "
            f"{array.shape}; allocate out with "
            f"numpy.empty({array.shape}, dtype=numpy.float32)"
        )
    if not out.flags.writeable:
        raise ValueError("to_float32 out= is read-only; pass a writeable array")
    return np.divide(array, _SCALE, out=out, dtype=np.float32)


def _check_size(size: object) -> tuple[int, int]:
    """Return `size` as a ``(height, width)`` tuple of positive ints, or raise."""
    wanted = f"size must be a (height, width) pair of positive integers, got {size!r}"
    items: tuple[object, ...] = ()
    if isinstance(size, Iterable) and not isinstance(size, (str, bytes)):
        items = tuple(size)
    if len(items) != 2:
        raise ValueError(wanted)
    checked: list[int] = []
    for value in items:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{wanted} ({value!r} is not an integer)")
        if value <= 0:
            raise ValueError(f"{wanted} ({value!r} is not positive)")
        checked.append(int(value))
    return (checked[0], checked[1])


def _describe(value: object) -> str:
    """Name the dtype of an ndarray, or the type of anything else, for messages."""
    if isinstance(value, np.ndarray):
        return f"dtype {value.dtype}"
    return type(value).__name__


def _check_dtype(dtype: object) -> str:
    """Return `dtype` as ``"float32"`` or ``"uint8"`` or raise ValueError."""
    name: object = dtype
    if isinstance(dtype, np.dtype):  # numpy.dtype("uint8")
        name = dtype.name
    elif isinstance(dtype, type) and issubclass(dtype, np.generic):  # numpy.float32
        name = np.dtype(dtype).name
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'float32' or 'uint8', got {dtype!r}")
    return str(name)


def _to_eight_bit(img: Image.Image) -> Image.Image:
    """Convert a loaded image to mode RGB, L or 1 (rules: the module docstring)."""
    from PIL import Image

    mode = img.mode
    if mode in _AS_IS:
        return img
    if mode == "P":
        has_alpha = "transparency" in img.info or (
            img.palette is not None and img.palette.mode == "RGBA"
        )
        if not has_alpha:
            return img.convert("RGB")
        img, mode = img.convert("RGBA"), "RGBA"
    elif mode in ("PA", "RGBa"):
        img, mode = img.convert("RGBA"), "RGBA"
    elif mode == "La":
        img, mode = img.convert("LA"), "LA"
    if mode in ("RGBA", "LA"):
        return Image.fromarray(_over_white(np.asarray(img)))
    if mode in _SIXTEEN_BIT:
        wide = np.clip(np.asarray(img).astype(np.int64), 0, 65535)
        return Image.fromarray(((wide + 128) // 257).astype(np.uint8))  # round(v / 257)
    if mode == "F":
        unit = np.clip(np.nan_to_num(np.asarray(img, dtype=np.float32)), 0.0, 1.0)
        return Image.fromarray(np.rint(unit * 255.0).astype(np.uint8))
    return img.convert("RGB")


def _over_white(pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Composite ``(H, W, C + 1)`` colour+alpha pixels over white, drop alpha."""
    colour = pixels[..., :-1].astype(np.uint16)
    alpha = pixels[..., -1:].astype(np.uint16)
    # round((c * a + 255 * (255 - a)) / 255); at most 65152, fits uint16
    blended = ((colour * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    return blended[..., 0] if blended.shape[-1] == 1 else blended


class BatchLoader:
    """A loader that computes a batch of items at once, in a device worker process.

    Subclass it and define ``__call__(self, items)``: ``items`` is a list of
    what :attr:`prepare` returned for each key (the keys themselves, ``str``,
    without it), in key order; it returns an array whose leading dimension is
    ``len(items)`` (row ``i`` is item ``i``'s value) or, for a store of
    records, a dict of field name -> such an array (a ragged field: a list of
    ``len(items)`` arrays, or a :class:`~tensorstore_cache.Ragged` batch; a
    text field: a list of ``str``).

    The instance is pickled and sent to one device worker process per
    distinct device (:attr:`devices`, default ``("cpu",)``), each started
    from a clean interpreter: CUDA works there. In each, :attr:`device` is
    set to the device's name and :meth:`setup` is called once, before the
    first batch: create the model there, not in ``__init__``, so that the
    calling process never loads it.

    How it batches is part of the loader: class attributes of a subclass, or
    the arguments of this constructor (a subclass's ``__init__`` passes them
    on with ``super().__init__(batch_size=..., ...)``).

    Parameters
    ----------
    batch_size
        Items per call (default 256). A shard's keys go in batches, in key
        order; the last batch of a shard may be shorter.
    prepare
        A per-key function ``key -> item`` run in the CPU worker processes
        (``workers=`` of them, as a per-key loader is); its picklable results
        are the loader's ``items`` (default: the keys). When the loader
        declares no ``item_shape`` and no ``fields=`` are given, the first
        batch is prepared in the building process and its result (kept, never
        computed again) gives the shape.
    devices
        The devices it runs on (default ``("cpu",)``): one device worker
        process per distinct device, where :meth:`setup` runs once; nothing
        of the loader runs in the building process. Shards go round the
        devices.

    Examples
    --------
    >>> class Norms(BatchLoader):
    ...     def __call__(self, items):
    ...         return np.array([[len(k)] for k in items], np.float32)
    >>> Norms(batch_size=64)(["a.jpg", "bb.jpg"]).tolist()
    [[5.0], [6.0]]
    """

    batch_size: int = 256
    """Items per call."""
    prepare: Callable[[str], Any] | None = None
    """The per-key stage run in the CPU workers (None: the items are the keys)."""
    devices: Sequence[str] = ("cpu",)
    """The devices it runs on: one device worker each (distinct names)."""
    device: str = "cpu"
    """The device this worker computes on (set before :meth:`setup` is called)."""

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        prepare: Callable[[str], Any] | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        if batch_size is not None:
            self.batch_size = batch_size
        if prepare is not None:
            self.prepare = prepare
        if devices is not None:
            self.devices = devices

    def setup(self, device: str) -> None:
        """Prepare to compute on ``device`` (load the model there): once per device worker.

        Does nothing by default.

        Parameters
        ----------
        device
            The name of the device this worker computes on (also :attr:`device`).
        """

    def __call__(self, items: list[Any]) -> Any:
        """Compute the values of ``items``: one row per item, in order."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must define __call__(self, items) returning one row "
            "per item"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderInfo:
    """A loader and what identifies its output (recorded in every store it builds)."""

    fn: Loader | BatchLoader
    """The callable ``path -> array``, or a batch loader."""
    loader_id: str
    """Name of what it computes, e.g. ``"tensorstore_cache.image/1"``."""
    params: dict[str, Any]
    """Its parameters (JSON values)."""
    item_shape: tuple[int, ...] | None
    """Shape of one output, when the loader declares it (else it is probed)."""


def resolve_loader(
    loader: Loader | BatchLoader | None,
    *,
    loader_id: str | None = None,
    size: tuple[int, int] | None = None,
    dtype: str = "float32",
    strict: bool = False,
) -> LoaderInfo:
    """Return the loader to build with and its identity.

    Parameters
    ----------
    loader
        A callable ``path -> array``, or None for :class:`ImageLoader` of ``size``
        and ``dtype``. Its ``loader_id``, ``params`` and ``item_shape``
        attributes are used when present.
    loader_id
        Overrides the loader's own ``loader_id``.
    size
        ``(height, width)`` of the image loader (None: ``(32, 32)``); only with it.
    dtype
        Of the image loader (a custom loader's output is converted to it).
    strict
        Require an explicit identity for a custom loader (``loader_id`` or a
        ``loader_id`` attribute), as a cache does, which keeps the vectors of
        different transforms apart by it; and refuse ``loader_id`` without
        ``loader``. Otherwise a custom loader without one is named by its
        module and qualified name.

    Raises
    ------
    TypeError
        If ``loader`` is not callable or its ``params`` is not a dict, or ``size`` is
        given with a custom loader (it would not be used).
    ValueError
        If ``strict`` and the identity is missing, or ``size``/``dtype`` are invalid.
    """
    if loader is None:
        if strict and loader_id is not None:
            raise ValueError(
                "loader_id names a custom loader; without loader= the built-in image loader "
                f"is used and identifies itself - drop loader_id={loader_id!r} or pass loader="
            )
        image = ImageLoader(size=(32, 32) if size is None else size, dtype=dtype)
        return LoaderInfo(
            fn=image, loader_id=loader_id or image.loader_id, params=dict(image.params),
            item_shape=image.item_shape,
        )
    if not callable(loader):
        raise TypeError(f"loader must be a callable path -> array, got {loader!r}")
    if size is not None:
        raise TypeError(
            f"size={size!r} was provided but unused: it sets the built-in image loader's "
            f"(height, width), and the custom loader {loader!r} makes its own items; remove "
            "size= (or give the loader its own size parameter)"
        )
    name = getattr(loader, "__qualname__", type(loader).__qualname__)
    ident = loader_id if loader_id is not None else getattr(loader, "loader_id", None)
    if strict and (not isinstance(ident, str) or not ident.strip()):
        raise ValueError(
            f"cached() needs a loader_id for the custom loader {name!r}, a non-empty string "
            f"(got {ident!r}): the cache keeps the vectors of each transform apart by this name. "
            "Pass loader_id='myproject.thumbnails/1' (change it whenever the loader's output "
            "changes), or give the loader a `loader_id` attribute"
        )
    if not isinstance(ident, str) or not ident:
        ident = f"{getattr(loader, '__module__', '?')}.{name}"
    params = getattr(loader, "params", None) or {}
    if not isinstance(params, dict):
        raise TypeError(f"the loader's params must be a dict of JSON values, got {params!r}")
    shape = getattr(loader, "item_shape", None)
    return LoaderInfo(
        fn=loader,
        loader_id=ident,
        params=dict(params),
        item_shape=None if shape is None else tuple(int(d) for d in shape),
    )
