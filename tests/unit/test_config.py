"""Layer 0: errors, config (modes and their one validator), loaders (one resolver)."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorstore_cache import config
from tensorstore_cache.config import IdentityKind, Missing, OnError, OnStale, check_mode
from tensorstore_cache.loaders import LOADER_ID, ImageLoader, LoaderInfo, resolve_loader


@pytest.mark.parametrize(
    ("mode", "good", "shown"),
    [
        (OnError, "skip", "'raise' or 'skip'"),
        (IdentityKind, "content", "'stat', 'content' or 'none'"),
        (OnStale, "ignore", "'rebuild', 'raise' or 'ignore'"),
        (Missing, "ignore", "'raise' or 'ignore'"),
    ],
)
def test_check_mode_accepts_its_values_and_names_them_when_refusing(
    mode: Any, good: str, shown: str
) -> None:
    assert check_mode("opt", good, mode) == good
    for bad in ("SKIP", "", None, 1, ["skip"]):
        with pytest.raises(ValueError) as info:
            check_mode("opt", bad, mode)
        assert str(info.value) == f"opt must be {shown}, got {bad!r}"


def test_every_public_mode_option_is_checked_by_the_one_validator(tmp_path: Path) -> None:
    import tensorstore_cache as tsc

    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        tsc.build_store(["a"], tmp_path / "s.tsc", on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_stale must be 'rebuild', 'raise' or 'ignore'"):
        tsc.cached(["a"], cache_dir=tmp_path, on_stale="skip")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir()), "nothing is created for a wrong option"


def test_default_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.CACHE_DIR_ENV, "~/elsewhere")
    assert config.default_cache_dir() == Path("~/elsewhere").expanduser()
    monkeypatch.delenv(config.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert config.default_cache_dir() == Path("/xdg/tensorstore_cache")


class _Named:
    loader_id = "mine/2"
    params = {"k": 1}  # noqa: RUF012
    item_shape = [4, np.int64(2)]  # noqa: RUF012

    def __call__(self, path: str) -> Any:
        return np.zeros((4, 2))


def _plain(path: str) -> Any:
    return np.zeros(3)


def test_resolve_loader_default_is_the_image_loader() -> None:
    info = resolve_loader(None, size=(8, 6), dtype="uint8")
    assert isinstance(info.fn, ImageLoader) and info.fn.size == (8, 6)
    assert info == LoaderInfo(fn=info.fn, loader_id=LOADER_ID, params=info.fn.params, item_shape=(3, 8, 6))
    with pytest.raises(ValueError, match="dtype must be 'float32' or 'uint8'"):
        resolve_loader(None, dtype="float64")


def test_resolve_loader_reads_the_loaders_own_identity() -> None:
    info = resolve_loader(_Named())
    assert (info.loader_id, info.params, info.item_shape) == ("mine/2", {"k": 1}, (4, 2))
    assert resolve_loader(_Named(), loader_id="over/1").loader_id == "over/1"
    # without one, a build names a plain function by module and name; a cache refuses
    assert resolve_loader(_plain).loader_id == f"{__name__}._plain"
    with pytest.raises(ValueError, match="cached\\(\\) needs a loader_id for the custom loader '_plain'"):
        resolve_loader(_plain, strict=True)
    assert resolve_loader(functools.partial(_plain), loader_id="p/1", strict=True).loader_id == "p/1"


def test_resolve_loader_refuses_what_cannot_work() -> None:
    with pytest.raises(TypeError, match="loader must be a callable"):
        resolve_loader("not callable")  # type: ignore[arg-type]
    bad = _Named()
    bad.params = [1]  # type: ignore[assignment]
    with pytest.raises(TypeError, match="params must be a dict"):
        resolve_loader(bad)
    with pytest.raises(ValueError, match="without loader= the built-in image loader"):
        resolve_loader(None, loader_id="x/1", strict=True)


def test_errors_keep_their_data_across_pickling() -> None:
    import tensorstore_cache as tsc

    for err in (
        tsc.BuildError("m", [("a", "b")]),
        tsc.CorruptStoreError("m", "p", ["p", "q"]),
        tsc.KeyNotInStoreError(["k"]),
        tsc.StaleSourceError(["s"]),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.__dict__ == err.__dict__ and str(back) == str(err)
