"""Deterministic generator of book-cover-like images and a ratings table.

Writes, under ``--out DIR``:

- ``images/<xx>/<yy>/<isbn>.01.THUMBZZZ.<ext>``: ``--images`` covers of varied sizes
  (60-120 x 90-180 px), textured (gradient, noise, shapes and text) so that decoding
  costs what a real cover costs. About 2% are grayscale (``'L'``) JPEGs, a few are
  palette (``'P'``) and ``RGBA`` PNGs, the rest RGB JPEGs at quality 85.
- ``ratings.csv``: ``user_id,isbn,img_path,rating``; every cover is referenced 1..k
  times, rows shuffled, like the book-rating data the project started from.
  ``img_path`` is relative to ``DIR``.
- ``manifest.json``: the parameters, written last. A directory whose manifest matches
  the parameters is complete and is not generated again.

Run ``python -m benchmarks.common.make_images --out DIR --images N --seed 0``;
``--images 181777`` reproduces the scale of the original data (129,777 + 52,000 covers).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
MANIFEST = "manifest.json"
RATINGS = "ratings.csv"
MAX_REFS = 20  # a cover is referenced 1..MAX_REFS times
_CHUNK = 256


def _kind(i: int) -> str:
    """Image kind of cover ``i``: 'L' (2%), 'P' and 'RGBA' PNGs (0.25% each), else 'RGB'."""
    if i % 50 == 1:
        return "L"
    if i % 400 == 2:
        return "P"
    if i % 400 == 3:
        return "RGBA"
    return "RGB"


def _isbns(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng([seed, 0x15B2])
    nums = rng.choice(9_000_000_000, size=n, replace=False) + 1_000_000_000
    return [f"{int(x):010d}" for x in nums]


def relative_path(i: int, isbn: str) -> str:
    """Relative path of cover ``i`` (nested directories, extension by kind)."""
    ext = "png" if _kind(i) in ("P", "RGBA") else "jpg"
    return f"images/{i % 16:02x}/{(i // 16) % 16:02x}/{isbn}.01.THUMBZZZ.{ext}"


_TILE: dict[int, np.ndarray] = {}
_FONT: list[object] = []


def _noise_tile(seed: int) -> np.ndarray:
    """A 256 x 256 x 3 int16 noise tile, per seed, shared by every cover of a process."""
    tile = _TILE.get(seed)
    if tile is None:
        rng = np.random.default_rng([seed, 0x7153])
        tile = np.clip(rng.normal(0.0, 1.0, (256, 256, 3)) * 16.0, -64, 64).astype(np.int16)
        _TILE[seed] = tile
    return tile


def _font() -> object:
    if not _FONT:
        from PIL import ImageFont

        _FONT.append(ImageFont.load_default_imagefont())
    return _FONT[0]


def _render(i: int, seed: int) -> object:
    """Return the PIL image of cover ``i`` (deterministic in ``seed`` and ``i``)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng([seed, i])
    w = int(rng.integers(60, 121))
    h = int(rng.integers(90, 181))
    c0 = rng.integers(0, 256, 3).astype(np.int16)
    c1 = rng.integers(0, 256, 3).astype(np.int16)
    ty = (np.arange(h, dtype=np.int16) * 64 // h)[:, None, None]
    tx = (np.arange(w, dtype=np.int16) * 28 // w)[None, :, None]
    mix = ty + tx  # 0..91 (of 92)
    base = c0 + (c1 - c0) * mix // 92
    y0, x0 = (int(v) for v in rng.integers(0, 256 - 180, 2))
    amp = int(rng.integers(1, 4))
    noise = _noise_tile(seed)[y0 : y0 + h, x0 : x0 + w] * amp // 2
    pix = np.clip(base + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(pix, "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        xa, xb = sorted(int(v) for v in rng.integers(0, w, 2))
        ya, yb = sorted(int(v) for v in rng.integers(0, h, 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.rectangle((xa, ya, xb, yb), fill=fill)
        else:
            draw.ellipse((xa, ya, xb, yb), fill=fill)
    ink = tuple(int(v) for v in rng.integers(0, 256, 3))
    font = _font()
    for line in range(int(rng.integers(1, 4))):
        word = "".join(chr(int(c)) for c in rng.integers(65, 91, int(rng.integers(3, 9))))
        draw.text((4, 6 + 14 * line), word, fill=ink, font=font)  # type: ignore[arg-type]
    kind = _kind(i)
    if kind == "L":
        return img.convert("L")
    if kind == "P":
        return img.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    if kind == "RGBA":
        alpha = np.broadcast_to(np.linspace(40, 255, h).astype(np.uint8)[:, None], (h, w))
        img.putalpha(Image.fromarray(np.ascontiguousarray(alpha), "L"))
        return img
    return img


def _write_chunk(args: tuple[str, int, list[tuple[int, str]]]) -> int:
    out, seed, items = args
    root = Path(out)
    for i, rel in items:
        img = _render(i, seed)
        path = root / rel
        tmp = path.with_name(path.name + ".tmp")
        if rel.endswith(".png"):
            img.save(tmp, format="PNG")  # type: ignore[attr-defined]
        else:
            img.save(tmp, format="JPEG", quality=85)  # type: ignore[attr-defined]
        os.replace(tmp, path)
    return len(items)


def _ratings(isbns: list[str], rels: list[str], seed: int) -> list[tuple[int, str, str, int]]:
    rng = np.random.default_rng([seed, 0x7A7])
    n = len(isbns)
    counts = np.minimum(1 + rng.poisson(1.4, n), MAX_REFS)
    cover = np.repeat(np.arange(n), counts)
    rng.shuffle(cover)
    users = rng.integers(1, max(2, n // 2), cover.size)
    ratings = rng.integers(1, 11, cover.size)
    return [
        (int(u), isbns[c], rels[c], int(r))
        for u, c, r in zip(users.tolist(), cover.tolist(), ratings.tolist(), strict=True)
    ]


def _params(images: int, seed: int) -> dict[str, int]:
    return {"generator_version": GENERATOR_VERSION, "images": images, "seed": seed}


def is_complete(out: str | os.PathLike[str], images: int, seed: int) -> bool:
    """True if ``out`` holds a complete set generated with these parameters."""
    try:
        manifest = json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return bool(
        all(manifest.get(k) == v for k, v in _params(images, seed).items())
        and (Path(out) / RATINGS).is_file()
    )


def generate(
    out: str | os.PathLike[str], images: int, seed: int = 0, workers: int | None = None,
    quiet: bool = False,
) -> Path:
    """Generate the covers and ``ratings.csv`` under ``out``; return ``out/ratings.csv``.

    Does nothing if ``out`` already holds a complete set with the same parameters.
    """
    root = Path(out)
    if is_complete(root, images, seed):
        if not quiet:
            print(f"{root}: {images} covers (seed {seed}) already generated", file=sys.stderr)
        return root / RATINGS
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).unlink(missing_ok=True)
    isbns = _isbns(images, seed)
    rels = [relative_path(i, s) for i, s in enumerate(isbns)]
    for d in sorted({str(Path(r).parent) for r in rels}):
        (root / d).mkdir(parents=True, exist_ok=True)
    items = list(enumerate(rels))
    tasks = [(str(root), seed, items[k : k + _CHUNK]) for k in range(0, len(items), _CHUNK)]
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(tasks) <= 1:
        for task in tasks:
            _write_chunk(task)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(_write_chunk, tasks):
                pass
    rows = _ratings(isbns, rels, seed)
    tmp = root / (RATINGS + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["user_id", "isbn", "img_path", "rating"])
        writer.writerows(rows)
    os.replace(tmp, root / RATINGS)
    elapsed = time.perf_counter() - t0
    manifest = dict(_params(images, seed), ratings_rows=len(rows), seconds=round(elapsed, 3))
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if not quiet:
        print(
            f"{root}: wrote {images} covers and {len(rows)} ratings in {elapsed:.1f} s "
            f"({images / max(elapsed, 1e-9):,.0f} images/s)",
            file=sys.stderr,
        )
    return root / RATINGS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--images", type=int, default=20_000, help="number of covers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args(argv)
    generate(args.out, args.images, args.seed, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
