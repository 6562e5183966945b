"""The original transform, cached as it is: no cache of its own, no loader_id.

The write-up this library started from loaded each book cover with PIL,
resized it to 32 x 32 with torchvision and turned it into a tensor, again in
every sweep agent, and then kept a hand-made cache beside it. Here the same
function is handed to ``tsc.cached()`` unchanged, in one line: the first run
computes each cover once, every later run (a new process) maps the stored
vectors. The cache is named by what the function computes, so an edit to it
(another size, say) is computed anew rather than served stale.

Run::

    python examples/image_vector.py                     # 300 generated covers
    python examples/image_vector.py --images data/covers --cache-dir /tmp/covers-cache

Needs torchvision. Prints the vectors' shape, how many covers this run
computed and the name of their cache.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image
from torch.autograd import Variable
from torchvision import transforms

import tensorstore_cache as tsc


def image_vector(path):
    """The write-up's transform, as it was written (without its Manager cache)."""
    img = Image.open(path)
    img = transforms.Resize((32, 32))(img)
    return Variable(transforms.ToTensor()(img))


def make_covers(root: Path, n: int) -> list[str]:
    """Write ``n`` small JPEG "book covers" of random sizes and colours under ``root``."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(60, 120)), int(rng.integers(40, 90))
        pixels = np.clip(rng.integers(0, 256, 3) + rng.normal(0, 25, (h, w, 3)), 0, 255)
        path = root / f"{i:06d}.jpg"
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def main(argv: list[str] | None = None) -> None:
    """Cache the covers' vectors; say how many were computed by this run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, help="a folder of images (default: generated)")
    parser.add_argument("--n", type=int, default=300, help="covers to generate")
    parser.add_argument("--cache-dir", type=Path, help="the cache (default: the user's)")
    parser.add_argument("--workers", type=int, default=None, help="build processes")
    args = parser.parse_args(argv)
    if args.images is not None:
        paths = sorted(str(p) for p in args.images.iterdir() if p.is_file())
    else:
        root = Path(tempfile.gettempdir()) / "tsc-example-covers"
        root.mkdir(exist_ok=True)
        paths = make_covers(root, args.n)
    before = {c.loader_id: c.entries for c in tsc.list_caches(args.cache_dir)}
    t0 = time.perf_counter()
    # the whole change: the loop over image_vector becomes this line
    store = tsc.cached(paths, loader=image_vector, cache_dir=args.cache_dir, workers=args.workers)
    vectors = store.stack(paths)
    name = tsc.loader_fingerprint(image_vector).loader_id
    computed = len(store) - before.get(name, 0)
    print(f"{vectors.shape} vectors in {time.perf_counter() - t0:.2f} s; computed by this run: "
          f"{computed}; cache: {name}")


if __name__ == "__main__":
    main()
