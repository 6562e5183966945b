"""The tensorstore-cache command: in-process through main(argv) and as real processes."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tensorstore_cache as tsc
from tensorstore_cache.cli.main import main, parse_size
from tensorstore_cache.format.keys import normalize_key

from ..conftest import write_images

COLOURS = [(230, 30, 30), (30, 200, 60), (40, 60, 230), (250, 210, 20), (160, 40, 200), (0, 0, 0)]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.fixture
def solid(tmp_path: Path) -> Path:
    """Six solid-colour images in several formats and directories, plus files to ignore."""
    root = tmp_path / "covers"
    for i, colour in enumerate(COLOURS):
        sub = root / ("a" if i % 2 else "b/deep")
        sub.mkdir(parents=True, exist_ok=True)
        ext = [".jpg", ".PNG", ".bmp", ".webp", ".gif", ".tiff"][i]
        img = Image.new("RGB", (40 + i, 30 + 2 * i), colour)
        by_ext: dict[str, dict[str, Any]] = {".jpg": {"quality": 100}, ".webp": {"lossless": True}}
        options = by_ext.get(ext, {})
        img.save(sub / f"c{i}{ext}", **options)  # solid colours, stored exactly
    (root / "notes.txt").write_text("not an image")
    (root / "a" / "image.jpg.bak").write_text("not an image either")
    return root


def test_build_from_a_directory_then_info_and_verify(
    solid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "build", "covers", "--out", "covers.tsc", "--workers", "2")
    assert code == 0, err
    assert "built covers.tsc: 6 vectors 3x32x32 float32" in out
    store = tsc.open_store("covers.tsc")
    found = sorted(str(p.relative_to(tmp_path)) for p in solid.rglob("c*"))
    assert store.paths == sorted(normalize_key(p) for p in found)  # sorted, recursive, no .txt/.bak
    for p in found:
        np.testing.assert_array_equal(store[p], tsc.ImageLoader()(p))

    code, out, _ = run(capsys, "info", "covers.tsc")
    assert code == 0
    assert "entries   6" in out and "3 x 32 x 32 float32" in out and "tensorstore_cache.image/1" in out
    code, out, _ = run(capsys, "info", "covers.tsc", "--json")
    info = json.loads(out)
    assert code == 0 and info["entries"] == 6 and info["item_shape"] == [3, 32, 32]
    assert info["loader_params"]["size"] == [32, 32] and info["disk_bytes"] > 6 * 12288

    code, out, _ = run(capsys, "verify", "covers.tsc", "-q")
    assert code == 0 and "OK" in out


def test_verify_reports_damage_with_status_1(solid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "s.tsc"
    assert run(capsys, "build", str(solid), "--out", str(out_dir), "-q")[0] == 0
    shard = next(p for p in (out_dir / "vectors").rglob("*") if p.is_file() and p.name != "zarr.json")
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, _, err = run(capsys, "verify", str(out_dir))
    assert code == 1
    assert str(shard.relative_to(out_dir)) in err and "build it again" in err


def test_sources_csv_parquet_list_and_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_images(tmp_path / "img", 12, seed=2)
    with open(tmp_path / "books.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["isbn", "cover"])
        w.writerows([[i, p] for i, p in enumerate(paths + paths[:3])])  # repeats are stored once
    code, _, err = run(capsys, "build", str(tmp_path / "books.csv"), "--column", "cover",
                       "--out", str(tmp_path / "csv.tsc"), "-q", "--workers", "1")
    assert code == 0, err
    assert tsc.open_store(tmp_path / "csv.tsc").paths == [normalize_key(p) for p in paths]

    code, _, err = run(capsys, "build", str(tmp_path / "books.csv"), "--out", str(tmp_path / "x.tsc"))
    assert not (tmp_path / "x.tsc").exists()
    assert code == 2 and "no column 'img_path'" in err and "isbn, cover" in err

    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame({"img_path": paths[::-1]}).to_parquet(tmp_path / "t.parquet")
    code, _, err = run(capsys, "build", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "pq.tsc"),
                       "-q", "--dtype", "uint8", "--size", "16", "24", "--workers", "1")
    assert code == 0, err
    store = tsc.open_store(tmp_path / "pq.tsc")
    assert store.paths == [normalize_key(p) for p in paths[::-1]]
    assert store.spec.item_shape == (3, 16, 24) and store.spec.dtype == "uint8"

    (tmp_path / "list.txt").write_text("# covers\n" + "\n".join(paths[:5]) + "\n\n")
    code, _, err = run(capsys, "build", str(tmp_path / "list.txt"), "--out", str(tmp_path / "l.tsc"), "-q",
                       "--workers", "1")
    assert code == 0, err
    assert len(tsc.open_store(tmp_path / "l.tsc")) == 5

    proc = subprocess.run(
        [sys.executable, "-m", "tensorstore_cache", "build", "-", "--out", str(tmp_path / "stdin.tsc"), "-q",
         "--workers", "1"],
        input="\n".join(paths[:4]), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert tsc.open_store(tmp_path / "stdin.tsc").paths == [normalize_key(p) for p in paths[:4]]


def test_load_errors_fail_or_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "imgs"
    write_images(root, 6)
    bad = root / "d0" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 definitely not a jpeg")
    code, _, err = run(capsys, "build", str(root), "--out", str(tmp_path / "s.tsc"), "-q")
    assert code == 1 and str(bad) in err and "--on-error skip" in err
    assert not (tmp_path / "s.tsc").exists()
    code, out, err = run(capsys, "build", str(root), "--out", str(tmp_path / "s.tsc"), "-q",
                         "--on-error", "skip")
    assert code == 0 and "6 vectors" in out
    assert "skipped 1 source(s)" in err and str(bad) in err


def test_existing_store_needs_overwrite(solid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = str(tmp_path / "s.tsc")
    assert run(capsys, "build", str(solid), "--out", target, "-q")[0] == 0
    code, _, err = run(capsys, "build", str(solid), "--out", target, "-q")
    assert code == 1 and "--overwrite" in err
    assert run(capsys, "build", str(solid), "--out", target, "-q", "--overwrite", "--size", "8", "8")[0] == 0
    assert tsc.open_store(target).spec.item_shape == (3, 8, 8)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required: COMMAND"),
        (["frobnicate"], "invalid choice"),
        (["build", "x"], "--out"),
        (["build", "x", "--out", "y", "--size", "0", "3"], "must be at least 1"),
        (["build", "x", "--out", "y", "--dtype", "float64"], "invalid choice"),
        (["gc", "--max-size", "lots"], "invalid size"),
        (["gc", "--older-than", "-1"], "days must be"),
        # found wrong after parsing: the message, no usage
        (["build", "does-not-exist", "--out", "y"], "source 'does-not-exist' does not exist"),
        (["preview", "s.tsc", "--out", "grid.jpg"], "--out must name a .png file"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert needle in err
    assert err.splitlines()[-1].startswith("tensorstore-cache")  # "tensorstore-cache[ build]: error: ..."


def test_empty_directory_and_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "build", str(tmp_path / "empty"), "--out", str(tmp_path / "s.tsc"))
    assert code == 2 and "no image files found" in err
    for argv in (["info", str(tmp_path / "no.tsc")], ["preview", str(tmp_path / "no.tsc"), "--out", "g.png"]):
        code, _, err = run(capsys, *argv)
        assert code == 1 and "no store at" in err and "tensorstore-cache build" in err


def test_help_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("build", "info", "verify", "ls", "gc", "preview"):
        assert f"tensorstore-cache {command}" in out  # an example for each
    assert "exit status" in out
    code, out, _ = run(capsys, "build", "--help")
    assert code == 0 and "SOURCE is a directory" in out and "--on-error" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    code, out, _ = run(capsys, "--version")
    assert code == 0 and tsc.__version__ in out


def test_preview_draws_every_vector_in_its_colour(solid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "s.tsc"
    assert run(capsys, "build", str(solid), "--out", str(out_dir), "-q")[0] == 0
    png = tmp_path / "grid.png"
    code, out, err = run(capsys, "preview", str(out_dir), "--out", str(png), "--seed", "3")
    assert code == 0, err
    assert "6 entries" in out
    sheet = np.asarray(Image.open(png).convert("RGB"))
    store = tsc.open_store(out_dir)
    for key in store.paths:
        # each 32 x 32 solid vector is drawn 3x with nearest: >= 96 * 96 pixels of its colour
        colour = np.rint(store[key][:, 0, 0] * 255).astype(np.uint8)
        count = int(np.all(sheet == colour, axis=-1).sum())
        assert count >= 96 * 96, (key, colour.tolist(), count)

    chosen = [store.paths[4], store.paths[1]]
    code, out, _ = run(capsys, "preview", str(out_dir), "--out", str(png), "--paths", *chosen, "--scale", "2")
    assert code == 0 and "2 entries" in out
    sheet = np.asarray(Image.open(png).convert("RGB"))
    colours = [np.rint(store[k][:, 0, 0] * 255).astype(np.uint8) for k in store.paths]
    counts = [int(np.all(sheet == c, axis=-1).sum()) for c in colours]
    assert [i for i, c in enumerate(counts) if c >= 64 * 64] == [1, 4]

    listing = tmp_path / "paths.txt"
    listing.write_text(chosen[0] + "\n")
    code, out, _ = run(capsys, "preview", str(out_dir), "--out", str(png), "--paths", f"@{listing}")
    assert code == 0 and "1 entries" in out
    code, _, err = run(capsys, "preview", str(out_dir), "--out", str(png), "--paths", "missing.jpg")
    assert code == 1 and "'missing.jpg'" in err


def test_preview_uint8_and_non_image_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorstore_cache.cli.preview import to_pixels

    u8 = np.arange(2 * 3 * 2 * 2, dtype=np.uint8).reshape(2, 3, 2, 2)
    pixels, note = to_pixels(u8)
    assert pixels.shape == (2, 2, 2, 3) and note == "" and pixels[1, 0, 1].tolist() == u8[1, :, 0, 1].tolist()
    grey, _ = to_pixels(np.full((1, 1, 2, 2), 0.5, dtype=np.float32))
    assert grey[0, 0, 0].tolist() == [128, 128, 128]
    wide, note = to_pixels(np.array([[[[-2.0, 2.0]]]], dtype=np.float32))
    assert wide[0, 0].tolist() == [[0, 0, 0], [255, 255, 255]] and "stretched" in note

    store = tsc.build_store(["a", "b"], tmp_path / "emb.tsc", loader=embedding, loader_id="t/emb",
                            workers=1, progress=False, identity="none")
    code, _, err = run(capsys, "preview", store.location, "--out", str(tmp_path / "g.png"))
    assert code == 1 and "(7,)" in err


def embedding(path: str) -> np.ndarray:
    return np.full(7, len(path), dtype=np.float32)


def test_parse_size() -> None:
    assert parse_size("1024") == 1024
    assert parse_size("50G") == 50 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5k") == 1536
    assert parse_size("2 TB") == 2 << 40


def test_ls_and_gc_over_a_cache_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_images(tmp_path / "img", 8)
    cache = tmp_path / "cache"
    tsc.cached(paths, cache_dir=cache, progress=False, workers=1).close()
    tsc.cached(paths[:3], cache_dir=cache, size=(16, 16), progress=False, workers=1).close()
    code, out, _ = run(capsys, "ls", "--cache-dir", str(cache))
    assert code == 0
    assert "3x32x32 float32" in out and "3x16x16 float32" in out and "2 cache(s)" in out
    code, out, _ = run(capsys, "ls", "--cache-dir", str(cache), "--json")
    listed = json.loads(out)
    assert code == 0 and sorted(c["entries"] for c in listed) == [3, 8]

    code, out, _ = run(capsys, "gc", "--cache-dir", str(cache), "--older-than", "0", "--dry-run")
    assert code == 0 and out.count("would remove namespace") == 2 and "(dry run)" in out
    assert len(tsc.list_caches(cache)) == 2
    code, out, _ = run(capsys, "gc", "--cache-dir", str(cache), "--older-than", "0")
    assert code == 0 and out.count("removed namespace") == 2
    code, out, _ = run(capsys, "ls", "--cache-dir", str(cache))
    assert code == 0 and "no caches" in out


def test_real_processes(solid: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    target = tmp_path / "s.tsc"
    proc = subprocess.run([sys.executable, "-m", "tensorstore_cache", "build", str(solid), "--out",
                           str(target)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "built" in proc.stdout and "6/6" in proc.stderr  # the progress bar goes to stderr
    proc = subprocess.run([sys.executable, "-m", "tensorstore_cache", "info", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "no store at" in proc.stderr
    script = shutil.which("tensorstore-cache", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("the tensorstore-cache console script is not installed in this environment")
    proc = subprocess.run([script, "info", str(target), "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["entries"] == 6
    proc = subprocess.run([script, "build"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


# -- stores of records ----------------------------------------------------------------------


def cover_record(path: str) -> dict[str, Any]:
    """A record of source ``<i>.txt``: an 8 x 8 RGB cover of colour ``COLOURS[i]`` (H, W, 3),
    ``i + 1`` title ids, a rating and a title."""
    i = int(Path(path).stem)
    return {
        "cover": np.full((8, 8, 3), COLOURS[i], np.uint8),
        "title_ids": np.arange(10 * i, 10 * i + i + 1, dtype=np.int32),
        "rating": np.float32(i / 2),
        "title": f"book {i}",
    }


RECORD_FIELDS: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
    "cover": tsc.Fixed((8, 8, 3), "uint8"), "title_ids": tsc.Ragged("int32"),
    "rating": tsc.Fixed((), "float32"), "title": tsc.Text()}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """A store of six records (one per colour)."""
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(len(COLOURS)):
        (src / f"{i}.txt").write_text(str(i))
        paths.append(str(src / f"{i}.txt"))
    out = tmp_path / "records.tsc"
    tsc.build_store(paths, out, loader=cover_record, loader_id="t/covers", fields=RECORD_FIELDS,
                    workers=1, progress=False).close()
    return out


def test_info_lists_the_fields_of_records(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "info", str(records))
    assert code == 0, err
    lines = out.splitlines()
    assert "entries     6" in lines
    assert "record      4 field(s): 196 B fixed a record, plus ragged values" in lines
    # title ids: 1 to 6 ids (median 3.5); titles "book 0" .. "book 5": 6 bytes each
    assert "  cover     fixed   8 x 8 x 3 uint8" in lines
    assert "  title_ids ragged  * int32, length 1 / 3.5 / 6 (min / median / max)" in lines
    assert "  rating    fixed   scalar float32" in lines
    assert "  title     text    UTF-8, 6 / 6 / 6 bytes (min / median / max)" in lines
    assert "format      zarr v3 group, tensorstore_cache format 2, 6 rows per shard" in lines
    assert not [line for line in lines if line.startswith("vector")]
    code, out, _ = run(capsys, "info", str(records), "--json")
    info = json.loads(out)
    assert code == 0 and info["entries"] == 6 and info["format_version"] == 2
    by_name = {f["name"]: f for f in info["fields"]}
    assert by_name["cover"]["shape"] == [8, 8, 3] and "lengths" not in by_name["cover"]
    assert by_name["title_ids"]["lengths"] == {"min": 1, "median": 3.5, "max": 6}
    # of a store read through the node cache: from the offsets, no value fetched
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-m", "tensorstore_cache", "info", f"local://{records}", "--json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TSC_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    assert remote["fields"] == info["fields"]
    (version,) = [p for p in (cache / "remote").glob("*/*") if p.is_dir()]
    assert (version / "fields/title_ids/offsets/c/0").is_file()
    assert not (version / "fields/title_ids/values/c").exists()
    assert not (version / "fields/cover/c").exists()


def test_preview_draws_the_image_field_of_records_with_the_others_as_text(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorstore_cache.cli.preview import image_field, value_text

    png = tmp_path / "grid.png"
    code, out, err = run(capsys, "preview", str(records), "--out", str(png), "--seed", "3")
    assert code == 0, err
    assert "6 entries" in out
    sheet = np.asarray(Image.open(png).convert("RGB"))
    for colour in COLOURS:  # each 8 x 8 cover, (H, W, 3) on disk, drawn 12x
        count = int(np.all(sheet == np.array(colour, np.uint8), axis=-1).sum())
        assert count >= 96 * 96, (colour, count)
    store = tsc.open_store(records)
    assert image_field(store.spec) == ("cover", "hwc")
    # the captions: the three other fields of a record, under its name and directory
    tensors = tsc.build_store([str(records)], tmp_path / "t.tsc", loader=solid_tensor,
                              loader_id="t/solid", workers=1, progress=False)
    run(capsys, "preview", tensors.location, "--out", str(tmp_path / "t.png"), "--scale", "12")
    one = np.asarray(Image.open(tmp_path / "t.png"))
    run(capsys, "preview", str(records), "--out", str(png), "--paths", store.paths[0],
        "--scale", "12")
    drawn = np.asarray(Image.open(png))
    assert drawn.shape[0] == one.shape[0] + 3 * 13  # three more lines of caption
    assert value_text(store[store.paths[2]]["title_ids"]) == "(3) [20 21 22]"
    assert value_text(store[store.paths[2]]["rating"]) == "1"
    assert value_text(store[store.paths[5]]["title_ids"]) == "(6) [50 51 52 53 …]"
    # records without an image field: the error names the fields
    plain = tsc.build_store([str(records)], tmp_path / "p.tsc", loader=no_image,
                            loader_id="t/plain", workers=1, progress=False)
    code, _, err = run(capsys, "preview", plain.location, "--out", str(tmp_path / "p.png"))
    assert code == 1 and "a fixed field of images" in err and "ids (3,) int64, score () float32" in err


def solid_tensor(path: str) -> np.ndarray:
    return np.zeros((3, 8, 8), np.uint8)


def no_image(path: str) -> dict[str, Any]:
    return {"ids": np.arange(3), "score": np.float32(1.0)}


def test_ls_names_the_fields_of_a_cache_of_records(
    records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = sorted(str(p) for p in (tmp_path / "src").glob("*.txt"))
    cache = tmp_path / "cache"
    tsc.cached(paths, cache_dir=cache, loader=cover_record, loader_id="t/covers",
               fields=RECORD_FIELDS, workers=1, progress=False).close()
    tsc.cached(paths, cache_dir=cache, loader=no_image, loader_id="t/inferred",  # inferred
               workers=1, progress=False).close()
    code, out, err = run(capsys, "ls", "--cache-dir", str(cache))
    assert code == 0, err
    assert "record(cover, title_ids, rating, title)" in out and "record(ids, score)" in out
    assert "2 cache(s)" in out
    code, out, _ = run(capsys, "ls", "--cache-dir", str(cache), "--json")
    listed = json.loads(out)
    assert sorted(c["fields"] for c in listed) == [["cover", "title_ids", "rating", "title"],
                                                   ["ids", "score"]]
    assert all(c["entries"] == 6 and c["refused"] is None for c in listed)
