"""Tests for the default image loader (tensorstore_cache.loaders).

The reference is the pipeline the library replaces, written here from Pillow and
torch primitives exactly as torchvision performs it: ``Resize((H, W))`` on a PIL
image is ``img.resize((W, H), BILINEAR)``, ``ToTensor()`` is uint8 HWC -> CHW
``.float().div(255)``, and a 1-channel result is expanded to 3 channels.
"""

from __future__ import annotations

import concurrent.futures
import doctest
import json
import multiprocessing
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageCms

import tensorstore_cache as tsc
from tensorstore_cache import loaders as _loader
from tensorstore_cache.loaders import LOADER_ID, ImageLoader, to_float32

TARGETS = [(32, 32), (64, 48), (7, 3)]
# (width, height) of source images: a cover, smaller than every target, 1x1,
# non-square both ways, and exactly the (64, 48) target.
SOURCES = [(100, 150), (5, 3), (1, 1), (200, 40), (31, 77), (48, 64)]


# --------------------------------------------------------------------------- helpers


def reference(path: str | os.PathLike[str], size: tuple[int, int]) -> np.ndarray:
    """The original pipeline: PIL open, Resize((H, W)), ToTensor(), expand to 3."""
    height, width = size
    with Image.open(path) as opened:
        img = opened.resize((width, height), Image.Resampling.BILINEAR)  # F_pil.resize
    # ToTensor on a PIL image:
    tensor = torch.from_numpy(np.array(img, np.uint8, copy=True))
    if img.mode == "1":
        tensor = 255 * tensor
    tensor = tensor.view(img.size[1], img.size[0], len(img.getbands()))
    tensor = tensor.permute((2, 0, 1)).contiguous()
    data = tensor.to(dtype=torch.float32).div(255)
    if data.size()[0] != 3:  # the original: data.expand(3, H, W)
        data = data.expand(3, data.size()[1], data.size()[2])
    return np.ascontiguousarray(data.numpy())


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    assert actual.tobytes() == np.ascontiguousarray(expected).tobytes()


def picture(width: int, height: int, mode: str, seed: int = 0) -> Image.Image:
    """A smooth gradient with noise, so resizing and JPEG have work to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) * 7 % 256],
        axis=-1,
    )
    noise = rng.integers(-40, 40, size=base.shape)
    rgb = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))
    return rgb if mode == "RGB" else rgb.convert(mode)


def save(img: Image.Image, path: Path, **kwargs: Any) -> Path:
    img.save(path, **kwargs)
    return path


def load_u8(path: Path, size: tuple[int, int]) -> npt.NDArray[np.uint8]:
    return ImageLoader(size=size, dtype="uint8")(path)


# ------------------------------------------------- bit-identity with the original


@pytest.mark.parametrize("size", TARGETS, ids=str)
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_matches_original_pipeline_bit_for_bit(
    tmp_path: Path,
    size: tuple[int, int],
    source: tuple[int, int],
    mode: str,
    ext: str,
) -> None:
    path = save(picture(*source, mode), tmp_path / f"img.{ext}")
    with Image.open(path) as img:
        assert img.mode == mode
    expected = reference(path, size)

    got = ImageLoader(size=size)(path)

    assert_bitwise_equal(got, expected)
    assert got.flags.c_contiguous
    assert got.flags.writeable
    assert got.shape == ImageLoader(size=size).item_shape


@pytest.mark.parametrize("size", TARGETS, ids=str)
@pytest.mark.parametrize("mode", ["RGB", "L", "1"])
def test_uint8_output_converts_to_the_float32_output(
    tmp_path: Path, size: tuple[int, int], mode: str
) -> None:
    path = save(picture(90, 60, mode, seed=3), tmp_path / "img.png")
    as_float = ImageLoader(size=size)(path)

    as_u8 = load_u8(path, size)

    assert as_u8.dtype == np.uint8
    assert as_u8.shape == (3, *size)
    assert as_u8.flags.c_contiguous
    assert_bitwise_equal(to_float32(as_u8), as_float)


def test_grey_image_has_three_equal_channels(tmp_path: Path) -> None:
    path = save(picture(50, 70, "L"), tmp_path / "grey.png")
    out = ImageLoader(size=(16, 16))(path)
    assert np.array_equal(out[0], out[1])
    assert np.array_equal(out[0], out[2])
    assert out.std() > 0  # not a constant image


def test_bilevel_image_is_resized_like_the_original(tmp_path: Path) -> None:
    """Mode '1' worked in the original pipeline (NEAREST, values 0 or 1): keep it."""
    path = save(picture(45, 33, "1"), tmp_path / "bilevel.png")
    with Image.open(path) as img:
        assert img.mode == "1"
    got = ImageLoader(size=(16, 12))(path)
    assert_bitwise_equal(got, reference(path, (16, 12)))
    assert set(np.unique(got).tolist()) == {0.0, 1.0}


def test_exif_orientation_is_not_applied(tmp_path: Path) -> None:
    """The original pipeline ignored EXIF orientation; so does the loader."""
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = save(picture(40, 20, "RGB"), tmp_path / "rotated.jpg", exif=exif)
    with Image.open(path) as img:
        assert img.getexif()[0x0112] == 6
    got = ImageLoader(size=(20, 40))(path)  # stored (height, width), not displayed
    assert_bitwise_equal(got, reference(path, (20, 40)))


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    grey=st.booleans(),
    size=st.tuples(st.integers(1, 16), st.integers(1, 16)),
    data=st.data(),
)
def test_random_small_images_match_original(
    height: int,
    width: int,
    grey: bool,
    size: tuple[int, int],
    data: st.DataObject,
) -> None:
    shape = (height, width) if grey else (height, width, 3)
    flat = data.draw(st.lists(st.integers(0, 255), min_size=int(np.prod(shape)), max_size=None))
    pixels = np.array(flat[: int(np.prod(shape))], dtype=np.uint8).reshape(shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = save(Image.fromarray(pixels), Path(tmp) / "img.png")
        expected = reference(path, size)
        got = ImageLoader(size=size)(path)
        got_u8 = load_u8(path, size)
    assert_bitwise_equal(got, expected)
    assert_bitwise_equal(to_float32(got_u8), expected)


# ----------------------------------------------------------------- other modes


def _solid_palette(width: int, height: int) -> Image.Image:
    img = Image.new("P", (width, height), 0)
    img.putpalette([255, 0, 0, 0, 0, 255] + [0] * (256 * 3 - 6))  # 0 red, 1 blue
    return img


def _half_transparent_palette(width: int, height: int) -> Image.Image:
    img = _solid_palette(width, height)
    img.paste(1, (width // 2, 0, width, height))  # right half: index 1 (blue)
    img.info["transparency"] = 1  # ... which is transparent
    return img


def _lab_red() -> Image.Image:
    to_lab = ImageCms.buildTransform(
        ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB"), "RGB", "LAB"
    )
    lab = ImageCms.applyTransform(Image.new("RGB", (24, 16), (255, 0, 0)), to_lab)
    assert lab is not None
    return lab


def _sixteen_bit(mode: str, values: list[int]) -> Image.Image:
    dtype = {"I;16": "<u2", "I;16B": ">u2", "I": "<i4"}[mode]
    array = np.array([values], dtype=dtype)
    img = Image.frombuffer(mode, (len(values), 1), array.tobytes(), "raw", mode, 0, 1)
    assert img.mode == mode
    return img


ODD_FILES: dict[str, tuple[str, Callable[[], Image.Image]]] = {
    # name: (file name, image factory)
    "P": ("p.png", lambda: _solid_palette(30, 20)),
    "P-gif": ("p.gif", lambda: _solid_palette(30, 20)),
    "P-transparent": ("pt.png", lambda: _half_transparent_palette(30, 20)),
    "RGBA": ("rgba.png", lambda: picture(30, 20, "RGBA")),
    "LA": ("la.png", lambda: picture(30, 20, "LA")),
    "CMYK-jpeg": ("cmyk.jpg", lambda: Image.new("CMYK", (30, 20), (0, 255, 255, 0))),
    "CMYK-tiff": ("cmyk.tif", lambda: picture(30, 20, "CMYK")),
    "YCbCr-tiff": ("ycc.tif", lambda: picture(30, 20, "YCbCr")),
    "LAB-tiff": ("lab.tif", _lab_red),
    "I;16-png": ("i16.png", lambda: _sixteen_bit("I;16", [0, 257 * 100, 65535] * 9)),
    "I;16B-tiff": ("i16b.tif", lambda: _sixteen_bit("I;16B", [0, 30000, 65535] * 9)),
    "I-tiff": ("i32.tif", lambda: _sixteen_bit("I", [-5, 257 * 7, 70000] * 9)),
    "1": ("bilevel.png", lambda: picture(30, 20, "1")),
    "F-tiff": (
        "float.tif",
        lambda: Image.fromarray(np.linspace(-0.5, 1.5, 600, dtype=np.float32).reshape(20, 30)),
    ),
}
EXPECTED_MODE = {"P-gif": "P", "P-transparent": "P", "CMYK-jpeg": "CMYK"}


@pytest.fixture(params=sorted(ODD_FILES), ids=str)
def odd_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    name = request.param
    filename, factory = ODD_FILES[name]
    img = factory()
    path = save(img, tmp_path / filename)
    with Image.open(path) as reopened:
        want = EXPECTED_MODE.get(name, name.split("-")[0])
        assert reopened.mode == want, f"{name}: file opens as {reopened.mode}"
    return name, path


@pytest.mark.parametrize("size", [(32, 32), (7, 3)], ids=str)
def test_every_mode_gives_three_channels_in_unit_range(
    odd_file: tuple[str, Path], size: tuple[int, int]
) -> None:
    _, path = odd_file
    out = ImageLoader(size=size)(path)
    assert out.shape == (3, *size)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert np.isfinite(out).all()
    assert out.min() >= 0.0
    assert out.max() <= 1.0
    u8 = load_u8(path, size)
    assert u8.dtype == np.uint8
    assert_bitwise_equal(to_float32(u8), out)


def test_palette_image_gives_colours_not_indices(tmp_path: Path) -> None:
    path = save(_solid_palette(30, 20), tmp_path / "red.png")
    out = load_u8(path, (8, 8))
    assert (out[0] == 255).all()
    assert (out[1:] == 0).all()


def test_palette_transparency_is_white(tmp_path: Path) -> None:
    path = save(_half_transparent_palette(20, 10), tmp_path / "half.png")
    out = load_u8(path, (10, 20))  # same size: no blending across the edge
    left, right = out[:, :, :10], out[:, :, 10:]
    assert (left[0] == 255).all()
    assert (left[1:] == 0).all()
    assert (right == 255).all()  # transparent blue -> white background


def test_rgba_is_composited_over_white(tmp_path: Path) -> None:
    rgba = np.zeros((1, 4, 4), dtype=np.uint8)
    rgba[0, 0] = (0, 0, 255, 0)  # fully transparent blue
    rgba[0, 1] = (10, 200, 30, 255)  # opaque
    rgba[0, 2] = (255, 0, 0, 128)  # half red
    rgba[0, 3] = (0, 0, 0, 1)  # almost transparent black
    path = save(Image.fromarray(rgba), tmp_path / "rgba.png")
    out = load_u8(path, (1, 4))
    assert out[:, 0, 0].tolist() == [255, 255, 255]
    assert out[:, 0, 1].tolist() == [10, 200, 30]
    # round((255 * 128 + 255 * 127) / 255), round(255 * 127 / 255)
    assert out[:, 0, 2].tolist() == [255, 127, 127]
    assert out[:, 0, 3].tolist() == [254, 254, 254]
    assert_bitwise_equal(ImageLoader(size=(1, 4))(path), to_float32(out))


def test_grey_alpha_is_composited_over_white(tmp_path: Path) -> None:
    la = np.array([[[0, 0], [0, 255], [100, 128]]], dtype=np.uint8)
    path = save(Image.fromarray(la, "LA"), tmp_path / "la.png")
    out = load_u8(path, (1, 3))
    # round((100 * 128 + 255 * 127) / 255) = round(177.196) = 177
    assert out.tolist() == [[[255, 0, 177]]] * 3


@pytest.mark.parametrize(
    ("mode", "values", "expected"),
    [
        # round(v / 257): the inverse of v16 = 257 * v8
        ("I;16", [0, 128, 129, 257 * 100, 65535], [0, 0, 1, 100, 255]),
        ("I;16B", [0, 128, 129, 257 * 100, 65535], [0, 0, 1, 100, 255]),
        # 32-bit: read as 16-bit data, clipped to [0, 65535] first
        ("I", [-5, 129, 257 * 7, 65535, 70000], [0, 1, 7, 255, 255]),
    ],
)
def test_high_bit_depth_grey_is_scaled_to_eight_bits(
    tmp_path: Path, mode: str, values: list[int], expected: list[int]
) -> None:
    ext = "png" if mode == "I;16" else "tif"
    path = save(_sixteen_bit(mode, values), tmp_path / f"deep.{ext}")
    with Image.open(path) as img:
        assert img.mode == mode
    out = load_u8(path, (1, len(values)))
    assert out.tolist() == [[expected]] * 3


def test_float_image_is_read_as_unit_intensity(tmp_path: Path) -> None:
    values = np.array([[-1.0, 0.0, 0.5, 1.0, 2.0, np.nan]], dtype=np.float32)
    path = save(Image.fromarray(values), tmp_path / "float.tif")
    with Image.open(path) as img:
        assert img.mode == "F"
    out = load_u8(path, (1, 6))
    # round(255 * clip(v, 0, 1)), half to even; NaN -> 0
    assert out.tolist() == [[[0, 0, 128, 255, 255, 0]]] * 3


@pytest.mark.parametrize("ext", ["jpg", "tif"])
def test_cmyk_red_is_red(tmp_path: Path, ext: str) -> None:
    path = save(Image.new("CMYK", (30, 20), (0, 255, 255, 0)), tmp_path / f"c.{ext}")
    out = ImageLoader(size=(8, 8))(path)
    assert out[0].min() > 0.9
    assert out[1:].max() < 0.1


def test_ycbcr_and_lab_are_converted_to_rgb(tmp_path: Path) -> None:
    ycc = save(Image.new("RGB", (24, 16), (255, 0, 0)).convert("YCbCr"), tmp_path / "y.tif")
    lab = save(_lab_red(), tmp_path / "lab.tif")
    for path in (ycc, lab):
        out = ImageLoader(size=(4, 4))(path)
        assert out[0].min() > 0.9, path
        assert out[1:].max() < 0.1, path


@pytest.mark.parametrize(
    ("img", "rgb"),
    [
        (Image.new("HSV", (3, 2), (0, 255, 255)), [255, 0, 0]),
        (Image.new("RGBX", (3, 2), (1, 2, 3, 0)), [1, 2, 3]),
        (Image.new("RGBa", (3, 2), (0, 0, 0, 0)), [255, 255, 255]),
        (Image.new("La", (3, 2), (0, 0)), [255]),
    ],
    ids=["HSV", "RGBX", "RGBa", "La"],
)
def test_modes_without_a_file_format_are_converted(img: Image.Image, rgb: list[int]) -> None:
    converted = _loader._to_eight_bit(img)
    assert converted.mode in ("RGB", "L")
    assert np.asarray(converted)[0, 0].tolist() == (rgb if len(rgb) == 3 else rgb[0])


def test_palette_alpha_image_is_composited() -> None:
    img = Image.new("PA", (2, 1))
    img.putpalette([255, 0, 0, 0, 0, 255] + [0] * (256 * 3 - 6))
    img.putpixel((0, 0), (0, 255))  # opaque red
    img.putpixel((1, 0), (1, 0))  # transparent blue
    converted = _loader._to_eight_bit(img)
    assert np.asarray(converted).tolist() == [[[255, 0, 0], [255, 255, 255]]]


# --------------------------------------------------------------------- errors


def test_random_bytes_raise_oserror_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "noise.jpg"
    path.write_bytes(np.random.default_rng(1).bytes(3000))
    with pytest.raises(OSError, match="cannot decode image") as info:
        ImageLoader()(path)
    assert repr(str(path)) in str(info.value)
    assert not isinstance(info.value, FileNotFoundError)
    assert info.value.__cause__ is not None


def test_empty_file_raises_oserror_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(OSError, match="cannot decode image") as info:
        ImageLoader()(str(path))
    assert repr(str(path)) in str(info.value)


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_truncated_image_raises_oserror_naming_the_path(tmp_path: Path, ext: str) -> None:
    whole = save(picture(150, 100, "RGB"), tmp_path / f"whole.{ext}")
    path = tmp_path / f"truncated.{ext}"
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="cannot decode image") as info:
        ImageLoader()(path)
    assert repr(str(path)) in str(info.value)


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "missing.jpg"
    with pytest.raises(FileNotFoundError) as info:
        ImageLoader()(path)
    assert str(path) in str(info.value)


def test_directory_is_not_reported_as_a_decoding_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        ImageLoader()(tmp_path)


# --------------------------------------------------------- parameters, pickling


@pytest.mark.parametrize(
    "size",
    [(0, 32), (32, -1), (32,), (32, 32, 3), 32, "32x32", (32.0, 32), (True, 32), None],
    ids=repr,
)
def test_bad_size_raises_value_error_naming_it(size: object) -> None:
    with pytest.raises(ValueError, match="size must be") as info:
        ImageLoader(size=size)  # type: ignore[arg-type]
    assert repr(size) in str(info.value)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int8", "FLOAT32", None, np.int32])
def test_bad_dtype_raises_value_error_naming_it(dtype: object) -> None:
    with pytest.raises(ValueError, match="dtype must be") as info:
        ImageLoader(dtype=dtype)  # type: ignore[arg-type]
    assert repr(dtype) in str(info.value)


def test_size_and_dtype_are_normalised() -> None:
    loader = ImageLoader(size=[np.int64(24), 16], dtype=np.dtype("uint8"))  # type: ignore[arg-type]
    assert loader.size == (24, 16)
    assert type(loader.size[0]) is int
    assert loader.dtype == "uint8"
    assert ImageLoader(dtype=np.float32).dtype == "float32"  # type: ignore[arg-type]
    assert loader == ImageLoader(size=(24, 16), dtype="uint8")


def test_identity_and_params() -> None:
    loader = ImageLoader(size=(64, 48), dtype="uint8")
    assert loader.loader_id == LOADER_ID == "tensorstore_cache.image/1"
    assert loader.params == {
        "size": [64, 48],
        "resample": "bilinear",
        "channels": 3,
        "dtype": "uint8",
        "alpha": "white",
    }
    assert json.loads(json.dumps(loader.params)) == loader.params
    assert loader.item_shape == (3, 64, 48)
    assert ImageLoader().params != ImageLoader(size=(64, 64)).params
    assert ImageLoader().params != ImageLoader(dtype="uint8").params


def test_loader_is_frozen() -> None:
    loader = ImageLoader()
    with pytest.raises(AttributeError):
        loader.size = (64, 64)  # type: ignore[misc]


def test_pickle_round_trip(tmp_path: Path) -> None:
    loader = ImageLoader(size=(7, 3), dtype="uint8")
    clone = pickle.loads(pickle.dumps(loader))
    assert clone == loader
    assert hash(clone) == hash(loader)
    path = save(picture(20, 30, "RGB"), tmp_path / "a.png")
    assert_bitwise_equal(clone(path), loader(path))


def test_loader_runs_in_a_spawned_process(tmp_path: Path) -> None:
    path = save(picture(60, 40, "RGB"), tmp_path / "a.jpg")
    loader = ImageLoader(size=(16, 16))
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        remote = pool.submit(loader, str(path)).result(timeout=120)
    assert_bitwise_equal(remote, loader(path))


# --------------------------------------------------------------------- to_float32


def test_to_float32_matches_torch_for_every_value() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([np.arange(256), rng.integers(0, 256, 3 * 37 * 41 - 256)])
    array = rng.permutation(values).astype(np.uint8).reshape(3, 37, 41)
    expected = torch.from_numpy(array).float().div(255).numpy()
    assert_bitwise_equal(to_float32(array), expected)
    # multiplying by 1/255 would not be: make sure the test can tell the difference
    assert (array.astype(np.float32) * np.float32(1 / 255)).tobytes() != expected.tobytes()


def test_to_float32_fills_out() -> None:
    array = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
    out = np.full(array.shape, -1.0, dtype=np.float32)
    result = to_float32(array, out=out)
    assert result is out
    assert_bitwise_equal(out, torch.from_numpy(array).float().div(255).numpy())


def test_to_float32_of_a_strided_view_is_c_contiguous() -> None:
    array = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)[:, ::2, :].transpose(0, 2, 1)
    result = to_float32(array)
    assert result.flags.c_contiguous
    assert_bitwise_equal(result, np.ascontiguousarray(array).astype(np.float32) / 255)


@pytest.mark.parametrize(
    "array",
    [np.zeros(3, np.float32), np.zeros(3, np.int16), [0, 1, 2]],
    ids=["float32", "int16", "list"],
)
def test_to_float32_rejects_non_uint8(array: object) -> None:
    with pytest.raises(TypeError, match="uint8"):
        to_float32(array)  # type: ignore[arg-type]


def test_to_float32_rejects_bad_out() -> None:
    array = np.zeros((3, 4, 4), dtype=np.uint8)
    with pytest.raises(TypeError, match="float32"):
        to_float32(array, out=np.zeros((3, 4, 4), dtype=np.float64))
    with pytest.raises(ValueError, match=r"shape \(3, 4, 5\)"):
        to_float32(array, out=np.zeros((3, 4, 5), dtype=np.float32))
    read_only = np.zeros((3, 4, 4), dtype=np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        to_float32(array, out=read_only)


def test_docstring_examples() -> None:
    result = doctest.testmod(_loader, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_size_with_a_custom_loader_is_refused_by_name(tmp_path: Path) -> None:
    def double(path: str) -> np.ndarray:
        return np.zeros(2, np.float32)

    with pytest.raises(TypeError, match=r"size=\(8, 8\) was provided but unused"):
        tsc.build_store(["a"], tmp_path / "s.tsc", loader=double, size=(8, 8), progress=False)
    with pytest.raises(TypeError, match=r"size=\(8, 8\) was provided but unused"):
        tsc.cached(["a"], cache_dir=tmp_path / "c", loader=double, loader_id="d/1",
                   size=(8, 8), identity="none", progress=False)
    assert not (tmp_path / "s.tsc").exists() and not (tmp_path / "c").exists()
    store = tsc.cached(["a"], cache_dir=tmp_path / "c", loader=double, loader_id="d/1",
                       identity="none", workers=1, progress=False)
    assert store.spec.item_shape == (2,)
