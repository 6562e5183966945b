"""Records: cache a cover's pixels, its title's token ids and its rating, then train on them.

Each book has a cover image (decoded and resized once), a title of any length (tokenised
once, stored as a ragged field) and a rating. ``cached()`` computes every record once, in
worker processes, into one store; a ``StoreDataset`` serves padded batches from it to a
DataLoader, and a tiny model learns the rating from pixels and title together.

Run::

    python examples/records.py                 # 2,000 generated books
    python examples/records.py --n 20000 --steps 300 --workers 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

import tensorstore_cache as tsc
from tensorstore_cache.torch import StoreDataset

WORDS = ("red", "blue", "green", "dark", "light", "night", "day", "sea", "sky", "fire", "ice",
         "stone", "river", "city", "house", "garden", "king", "queen", "war", "peace", "love",
         "death", "secret", "lost", "last", "first", "little", "big")
FIELDS = {
    "image": tsc.Fixed((3, 32, 32), "uint8"),
    "title_ids": tsc.Ragged("int32"),
    "rating": tsc.Fixed((), "float32"),
}


def make_books(root: Path, n: int, seed: int = 0) -> list[str]:
    """Write ``n`` covers (PNG) each with its title beside it (``.txt``); return the covers."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        colour = rng.integers(0, 256, 3)
        pixels = np.clip(colour + rng.normal(0, 20, (48, 36, 3)), 0, 255).astype(np.uint8)
        path = root / f"{i % 16:02d}" / f"{i:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)
        title = " ".join(rng.choice(WORDS, rng.integers(1, 9)))
        path.with_suffix(".txt").write_text(title)
    return paths_of(root)


def paths_of(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*.png"))


def tokens(title: str) -> np.ndarray:
    """Token ids of a title: one per word, stable across processes (no salted ``hash``)."""
    return np.array([zlib.crc32(w.encode()) % 1000 + 1 for w in title.split()], dtype=np.int32)


def load_book(path: str) -> dict[str, object]:
    """One record: the cover at 32 x 32 (uint8, channels first), its title's ids, a rating.

    The rating depends on the cover's redness and on whether the title has "dark" in it, so
    a model needs both fields to learn it.
    """
    from PIL import Image

    with Image.open(path) as im:
        image = np.asarray(im.convert("RGB").resize((32, 32), Image.BILINEAR)).transpose(2, 0, 1)
    title = Path(path).with_suffix(".txt").read_text()
    rating = 1.0 + 6.0 * image[0].mean() / 255.0 + 3.0 * ("dark" in title.split())
    return {"image": np.ascontiguousarray(image), "title_ids": tokens(title),
            "rating": np.float32(rating)}


class Model(torch.nn.Module):
    """Each channel's mean through a linear layer, title ids through a bag of embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.pixels = torch.nn.Linear(3, 1)
        self.words = torch.nn.EmbeddingBag(1001, 1, mode="sum", padding_idx=0)

    def forward(self, image: torch.Tensor, title_ids: torch.Tensor) -> torch.Tensor:
        return (self.pixels(image.mean(dim=(2, 3))) + self.words(title_ids)).squeeze(1)


def train(store: tsc.CacheStore, args: argparse.Namespace) -> float:
    """Run ``args.steps`` optimisation steps over padded batches; return the last loss."""
    torch.manual_seed(0)
    ds = StoreDataset(store, fields=["image", "title_ids", "rating"], pad_value=0)
    loader = ds.dataloader(args.batch, shuffle=True, drop_last=True, num_workers=args.workers,
                           persistent_workers=args.workers > 0)
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step, loss = 0, torch.tensor(float("nan"))
    while step < args.steps:
        for batch in loader:  # image (B, 3, 32, 32) uint8; title_ids (B, Lmax) int32 padded
            image = batch["image"].float() / 255.0
            pred = model(image, batch["title_ids"].long())
            loss = torch.nn.functional.mse_loss(pred, batch["rating"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % max(1, args.steps // 5) == 0 or step == args.steps:
                print(f"step {step:4d}  loss {loss.item():8.3f}  longest title in batch "
                      f"{int(batch['title_ids_len'].max())} words", flush=True)
            if step == args.steps:
                break
    return float(loss.item())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="books to generate (default: 2000)")
    ap.add_argument("--steps", type=int, default=100, help="optimisation steps (default: 100)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default: 64)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--books", help="a directory of books to reuse (default: a temporary one)")
    ap.add_argument("--cache-dir", help="cache directory (default: a temporary one)")
    ap.add_argument("--build-workers", type=int, default=None, help="processes for the one build")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="records-") as tmp:
        books = Path(args.books) if args.books else Path(tmp) / "books"
        paths = paths_of(books) if books.is_dir() else make_books(books, args.n)
        t0 = time.perf_counter()
        store = tsc.cached(paths, loader=load_book, loader_id="examples.books/1", fields=FIELDS,
                           cache_dir=args.cache_dir or Path(tmp) / "cache",
                           workers=args.build_workers)
        lengths = store.take(store.rows(paths))["title_ids"].lengths  # one gather per field
        print(f"{len(store):,} records ready in {time.perf_counter() - t0:.2f} s "
              f"(titles of {int(np.min(lengths))} to {int(np.max(lengths))} words)")
        first = store[paths[0]]
        print(f"first record: image {tuple(first['image'].shape)} {first['image'].dtype}, "
              f"title ids {first['title_ids'].tolist()}, rating {float(first['rating']):.2f}")
        loss = train(store, args)
        print(f"final loss {loss:.3f}")
        store.close()


if __name__ == "__main__":
    main()
