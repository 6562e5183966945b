"""A contact sheet of a store's vectors: see that every vector is the right image.

:func:`contact_sheet` draws chosen (or random) entries as a grid of images,
each upscaled with nearest-neighbour so that a ``32 x 32`` vector is visible,
under it the file name (on up to two lines) and its directory. Of a store of
records it draws the image field (:func:`image_field`: the first fixed field
shaped like an image) and writes every other field, as text, in the caption.
Used by ``tensorstore-cache preview``.
"""

from __future__ import annotations

import math
import os
import posixpath
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageDraw, ImageFont

from ..format import StoreSpec
from ..reader import CacheStore

__all__ = ["contact_sheet", "image_field", "pick_rows", "to_pixels", "value_text"]

_TILE = 96  # target tile size in pixels (a 32 x 32 vector is shown 3x)
_PAD = 6
_BG = (255, 255, 255)
_INK = (20, 20, 20)
_FAINT = (110, 110, 110)
_FRAME = (190, 190, 190)

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


def pick_rows(
    store: CacheStore,
    paths: Iterable[str | os.PathLike[str]] | None = None,
    n: int = 64,
    seed: int | None = None,
) -> npt.NDArray[np.int64]:
    """Rows to show: those of ``paths`` (in order), else ``n`` distinct random rows."""
    if paths is not None:
        return store.rows(paths)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    return rng.choice(len(store), size=min(n, len(store)), replace=False).astype(np.int64)


def to_pixels(batch: npt.NDArray[Any]) -> tuple[npt.NDArray[np.uint8], str]:
    """Turn ``(B, C, H, W)`` / ``(B, H, W)`` vectors into ``(B, H, W, 3)`` uint8 pixels.

    ``uint8`` values are shown as they are and floats in ``[0, 1]`` are
    scaled by 255; other values are stretched from their minimum and
    maximum over the whole sheet (the returned note says so).

    Raises
    ------
    ValueError
        If the vectors are not images: 1 or 3 channels first, or 2-D.
    """
    shape = batch.shape[1:]
    if len(shape) == 2:
        batch = batch[:, None]
    elif not (len(shape) == 3 and shape[0] in (1, 3)):
        raise ValueError(
            f"preview draws image vectors of shape (3, H, W), (1, H, W) or (H, W); this store "
            f"holds vectors of shape {tuple(shape)}"
        )
    note = ""
    if batch.dtype == np.uint8:
        pixels = batch
    else:
        values = np.nan_to_num(batch.astype(np.float64, copy=False))
        lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
        if lo < 0.0 or hi > 1.0:
            note = f"values stretched from [{lo:.3g}, {hi:.3g}]"
            values = (values - lo) / (hi - lo or 1.0)
        pixels = np.rint(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8)
    if pixels.shape[1] == 1:
        pixels = np.repeat(pixels, 3, axis=1)
    return np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)), note


def image_field(spec: StoreSpec) -> tuple[str, str] | None:
    """The field of a store of records that ``preview`` draws, and its axis order.

    The first fixed field shaped like an image: ``(3, H, W)`` or ``(1, H, W)``
    (``"chw"``), ``(H, W, 3)`` or ``(H, W, 1)`` (``"hwc"``), or ``(H, W)`` with
    both sizes at least 2 (``"hw"``). None if no field is.
    """
    for layout in spec.fields:
        if layout.kind != "fixed":
            continue
        shape = tuple(int(d or 0) for d in layout.field.shape)
        if len(shape) == 3 and shape[0] in (1, 3):
            return layout.name, "chw"
        if len(shape) == 3 and shape[2] in (1, 3):
            return layout.name, "hwc"
        if len(shape) == 2 and min(shape) >= 2:
            return layout.name, "hw"
    return None


def value_text(value: Any) -> str:
    """One value of a field, short, as a caption shows it.

    Examples
    --------
    >>> value_text(np.float32(0.25)), value_text("book 3")
    ('0.25', 'book 3')
    >>> value_text(np.arange(6, dtype=np.int32))
    '(6) [0 1 2 3 …]'
    """
    if isinstance(value, str):
        return value
    a = np.asarray(value)
    if a.ndim == 0:
        item = a.item()
        return f"{item:.4g}" if a.dtype.kind == "f" else str(item)
    shown = a.reshape(-1)[:4].tolist()
    items = " ".join(f"{x:.4g}" if a.dtype.kind == "f" else str(x) for x in shown)
    more = " …" if a.size > 4 else ""
    return f"({'x'.join(str(d) for d in a.shape)}) [{items}{more}]"


def _records(
    store: CacheStore, idx: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[Any], str, list[list[str]]]:
    """A store of records' images of ``idx`` (``(B, C, H, W)`` or ``(B, H, W)``), what the
    header says of them, and every tile's other fields as caption lines."""
    spec = store.spec
    found = image_field(spec)
    if found is None:
        shown = ", ".join(
            f"{f.name} {tuple(f.field.shape)} {f.dtype}" for f in spec.fields
        )
        raise ValueError(
            "preview draws a fixed field of images, shaped (3, H, W), (H, W, 3) or (H, W); "
            f"this store's fields are {shown}"
        )
    name, order = found
    images = store.field(name).take(idx)
    if order == "hwc":
        images = images.transpose(0, 3, 1, 2)
    layout = next(f for f in spec.fields if f.name == name)
    what = f"records, {name} {' x '.join(str(d) for d in layout.field.shape)} {layout.dtype}"
    lines: list[list[str]] = [[] for _ in range(len(idx))]
    for f in spec.fields:
        if f.name == name:
            continue
        values = store.field(f.name).take(idx)
        for i in range(len(idx)):
            lines[i].append(f"{f.name}: {value_text(values[i])}")
    return images, what, lines


def _font(size: int) -> Font:
    try:
        return ImageFont.load_default(size=size)
    except (OSError, TypeError, ValueError):  # Pillow without FreeType: a fixed bitmap font
        return ImageFont.load_default()


def _fit(draw: ImageDraw.ImageDraw, text: str, font: Font, width: int, *, keep: str = "middle") -> str:
    """``text``, shortened with '…' (in the middle, at the start, or at the end: ``keep`` is
    ``"middle"``, ``"end"`` or ``"start"``, what is kept) to fit ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    for n in range(len(text) - 1, 0, -1):
        if keep == "start":
            short = text[:n] + "…"
        elif keep == "end":
            short = "…" + text[len(text) - n:]
        else:
            head = (n + 1) // 2
            short = text[:head] + "…" + text[len(text) - (n - head):]
        if draw.textlength(short, font=font) <= width:
            return short
    return "…"


def _two_lines(draw: ImageDraw.ImageDraw, text: str, font: Font, width: int) -> tuple[str, str]:
    """Split ``text`` over two lines of ``width`` pixels; the second keeps the end."""
    if draw.textlength(text, font=font) <= width:
        return text, ""
    cut = 1
    while cut < len(text) and draw.textlength(text[: cut + 1], font=font) <= width:
        cut += 1
    return text[:cut], _fit(draw, text[cut:], font, width, keep="end")


def contact_sheet(
    store: CacheStore,
    rows: Sequence[int] | npt.NDArray[np.int64],
    *,
    scale: int | None = None,
    columns: int | None = None,
) -> Image.Image:
    """Draw the vectors of ``rows`` as a grid of captioned images.

    Parameters
    ----------
    store
        The open store.
    rows
        Rows to draw, in order (left to right, top to bottom).
    scale
        Upscaling factor (nearest-neighbour); default: enough for tiles of
        about 96 pixels.
    columns
        Tiles per row; default: a square-ish grid.

    Returns
    -------
    PIL.Image.Image
        An RGB image; save it with ``.save("grid.png")``.
    """
    idx = np.asarray(rows, dtype=np.int64)
    if idx.size == 0:
        raise ValueError("nothing to draw: no rows chosen")
    spec = store.spec
    extra: list[list[str]] = [[] for _ in range(len(idx))]
    if spec.records:
        images, what, extra = _records(store, idx)
    else:
        images = store.take(idx)
        what = f"entries, {' x '.join(str(d) for d in spec.item_shape or ())} {spec.dtype}"
    pixels, note = to_pixels(images)
    b, h, w, _ = pixels.shape
    k = scale or max(1, math.ceil(_TILE / max(h, w)))
    tile_w, tile_h = w * k, h * k
    cell_w = max(tile_w, 120 if spec.records else 72)
    cols = columns or max(1, math.ceil(math.sqrt(b)))
    lines = math.ceil(b / cols)
    small, big = _font(11), _font(14)
    cap_h = (3 + len(extra[0])) * 13 + 4
    head_h = 30 + (16 if note else 0)
    sheet = Image.new("RGB", (_PAD + cols * (cell_w + _PAD), head_h + lines * (tile_h + cap_h + _PAD) + _PAD), _BG)
    draw = ImageDraw.Draw(sheet)
    name = posixpath.basename(store.location.rstrip("/")) or store.location
    header = f"{name}: {b} of {len(store):,} {what}"
    draw.text((_PAD, 8), _fit(draw, header, big, sheet.width - 2 * _PAD), fill=_INK, font=big)
    if note:
        draw.text((_PAD, 26), note, fill=_FAINT, font=small)
    paths = store.paths
    for i in range(b):
        r, c = divmod(i, cols)
        x = _PAD + c * (cell_w + _PAD) + (cell_w - tile_w) // 2
        y = head_h + r * (tile_h + cap_h + _PAD)
        tile = Image.fromarray(pixels[i], "RGB").resize((tile_w, tile_h), Image.Resampling.NEAREST)
        sheet.paste(tile, (x, y))
        draw.rectangle((x - 1, y - 1, x + tile_w, y + tile_h), outline=_FRAME)
        key = paths[int(idx[i])]
        folder, base = posixpath.split(key)
        cx = _PAD + c * (cell_w + _PAD)
        first, second = _two_lines(draw, base, small, cell_w)
        draw.text((cx, y + tile_h + 3), first, fill=_INK, font=small)
        if second:
            draw.text((cx, y + tile_h + 16), second, fill=_INK, font=small)
        below = y + tile_h + (29 if second else 16)
        draw.text((cx, below), _fit(draw, folder or ".", small, cell_w), fill=_FAINT, font=small)
        for j, line in enumerate(extra[i]):  # the other fields of a record
            draw.text((cx, below + 13 * (j + 1)), _fit(draw, line, small, cell_w, keep="start"),
                      fill=_INK, font=small)
    return sheet
