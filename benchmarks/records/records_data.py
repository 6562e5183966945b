"""The records of the records benchmark: a cover, its title's token ids, its rating.

Every method builds its store with the same loader, in its own worker processes:

- :class:`RecordLoader` (the real data): ``path -> {"image", "title_ids", "rating"}``,
  where ``image`` is the cover decoded and resized to ``(3, 32, 32)`` uint8 (bilinear,
  like the library's ``ImageLoader(dtype="uint8")`` for RGB and grey covers; other modes
  converted to RGB first), ``title_ids`` the token ids of the book's generated title
  (int32, 3 to 60 tokens) and ``rating`` the book's mean rating (float32 scalar).
- :class:`SyntheticRecords`: the same fields from a key's number, no file read, for
  stores of many records written quickly (open time versus N).

The inputs (keys, titles, ratings) are written once by :func:`write_inputs` into a
directory that every process reads. This module imports only numpy and Pillow, so the
peers' environments can run it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SHAPE = (3, 32, 32)
MIN_TOKENS, MAX_TOKENS = 3, 60
VOCAB_SIZE = 8_000
KEYS, TITLES, RATINGS = "keys.txt", "titles.txt", "ratings.npy"
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "da", "fe", "go", "hu", "ji",
              "be", "no", "pa", "qui", "re", "si", "tu", "ve", "wa", "xo", "yu", "ze", "an",
              "el", "or", "us", "im")


def vocabulary() -> list[str]:
    """``VOCAB_SIZE`` distinct words of 2 to 4 syllables, the same on every machine."""
    rng = np.random.default_rng(0x7171)
    words: dict[str, None] = {}
    while len(words) < VOCAB_SIZE:
        k = int(rng.integers(2, 5))
        words["".join(_SYLLABLES[int(s)] for s in rng.integers(0, len(_SYLLABLES), k))] = None
    return list(words)


def title_lengths(n: int, seed: int) -> np.ndarray:
    """Token counts of ``n`` titles: mostly 5 to 15, a long tail up to ``MAX_TOKENS``."""
    rng = np.random.default_rng([seed, 0x7171])
    raw = np.rint(rng.lognormal(np.log(9.0), 0.55, n))
    return np.clip(raw, MIN_TOKENS, MAX_TOKENS).astype(np.int64)


def generate_titles(n: int, seed: int) -> list[str]:
    """``n`` titles of generated words (frequent words first, as in real text)."""
    words = vocabulary()
    lengths = title_lengths(n, seed)
    rng = np.random.default_rng([seed, 0x7172])
    ids = np.minimum((VOCAB_SIZE * rng.random(int(lengths.sum())) ** 2.5).astype(np.int64),
                     VOCAB_SIZE - 1)
    ends = np.cumsum(lengths)
    return [" ".join(words[int(w)] for w in ids[e - k : e])
            for e, k in zip(ends.tolist(), lengths.tolist(), strict=True)]


def write_inputs(out: Path, keys: list[str], ratings: np.ndarray, seed: int) -> Path:
    """Write the keys, generated titles and ratings (float32, one per key) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if len(ratings) != len(keys):
        raise ValueError(f"{len(ratings)} ratings for {len(keys)} keys")
    (out / KEYS).write_text("\n".join(keys) + "\n", encoding="utf-8")
    (out / TITLES).write_text("\n".join(generate_titles(len(keys), seed)) + "\n",
                              encoding="utf-8")
    np.save(out / RATINGS, np.asarray(ratings, dtype=np.float32))
    (out / "inputs.json").write_text(json.dumps({"records": len(keys), "seed": seed}) + "\n")
    return out


def read_keys(inputs: str | os.PathLike[str]) -> list[str]:
    """The keys written by :func:`write_inputs`, in order."""
    return Path(inputs, KEYS).read_text(encoding="utf-8").splitlines()


def decode_cover(path: str) -> np.ndarray:
    """The cover at ``path`` as ``(3, 32, 32)`` uint8: bilinear resize, grey to 3 channels."""
    from PIL import Image

    with Image.open(path) as img:
        im = img if img.mode in ("RGB", "L") else img.convert("RGB")
        small = im.resize((IMAGE_SHAPE[2], IMAGE_SHAPE[1]), Image.Resampling.BILINEAR)
        a = np.asarray(small)
    if a.ndim == 2:
        return np.ascontiguousarray(np.broadcast_to(a, IMAGE_SHAPE))
    return np.ascontiguousarray(a.transpose(2, 0, 1))


class RecordLoader:
    """``path -> {"image", "title_ids", "rating"}`` for the keys of an inputs directory.

    Picklable (it holds the directory's name); each process reads the inputs once, at
    its first call. Titles are tokenised at each call: whitespace split, word -> id in
    the vocabulary, ids from 1 (0 is the padding value).
    """

    loader_id = "benchmarks.records/1"

    def __init__(self, inputs: str | os.PathLike[str]) -> None:
        self.inputs = str(inputs)
        self._table: dict[str, tuple[str, np.float32]] | None = None
        self._vocab: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"inputs": self.inputs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.inputs, self._table, self._vocab = state["inputs"], None, None

    def _load(self) -> tuple[dict[str, tuple[str, np.float32]], dict[str, int]]:
        if self._table is None or self._vocab is None:
            keys = read_keys(self.inputs)
            titles = Path(self.inputs, TITLES).read_text(encoding="utf-8").splitlines()
            ratings = np.load(Path(self.inputs, RATINGS))
            self._table = dict(zip(keys, zip(titles, ratings, strict=True), strict=True))
            self._vocab = {w: i + 1 for i, w in enumerate(vocabulary())}
        return self._table, self._vocab

    def tokens(self, title: str) -> np.ndarray:
        _, vocab = self._load()
        return np.array([vocab[w] for w in title.split()], dtype=np.int32)

    def __call__(self, path: str) -> dict[str, Any]:
        table, _ = self._load()
        title, rating = table[str(path)]
        return {"image": decode_cover(str(path)), "title_ids": self.tokens(title),
                "rating": np.float32(rating)}


def synthetic_keys(n: int) -> list[str]:
    """Keys of :class:`SyntheticRecords`: ``synthetic/0000000`` ..."""
    return [f"synthetic/{i:07d}" for i in range(n)]


class SyntheticRecords:
    """Records made from a key's number, no file read (open time does not depend on them)."""

    loader_id = "benchmarks.records-synthetic/1"

    def __call__(self, key: str) -> dict[str, Any]:
        i = int(str(key).rsplit("/", 1)[1])
        rng = np.random.default_rng([0x5EC, i])
        n = int(rng.integers(MIN_TOKENS, MAX_TOKENS + 1))
        return {"image": rng.integers(0, 256, IMAGE_SHAPE, dtype=np.uint8),
                "title_ids": rng.integers(1, VOCAB_SIZE + 1, n, dtype=np.int32),
                "rating": np.float32(rng.integers(1, 11))}
