"""The check of each record a loader returns: the cheap path for records already of the
schema's dtypes and shapes gives what the general check gives, and refuses the same records
with the same errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.writer import records
from tensorstore_cache.writer.records import Schema, check_record, record_checker

SCHEMA: Schema = (
    ("image", tsc.Fixed((3, 4, 4), "uint8")),
    ("boxes", tsc.Ragged("float32", shape=(None, 4))),
    ("rating", tsc.Fixed((), "float32")),
)


def _good() -> dict[str, Any]:
    return {"image": np.arange(48, dtype=np.uint8).reshape(3, 4, 4),
            "boxes": np.ones((2, 4), np.float32), "rating": np.float32(4.5)}


def _outcome(check: Any, value: object) -> tuple[str, Any]:
    try:
        return "ok", check("k/0.bin", value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


class _Sub(np.ndarray):
    pass


def _variants() -> list[object]:
    good = _good()
    out: list[object] = [good, dict(good, rating=np.array(4.5, np.float32)),
                         dict(good, rating=4.5), dict(good, boxes=[[1, 2, 3, 4]]),
                         dict(good, boxes=np.zeros((0, 4), np.float32)),
                         dict(good, image=good["image"].view(_Sub))]
    out += [dict(good, image=good["image"].astype(np.int16)),  # a dtype that is not the field's
            dict(good, image=np.zeros((3, 4, 5), np.uint8)),  # a fixed shape that is not
            dict(good, boxes=np.ones((2, 3), np.float32)),  # a declared size that is not
            dict(good, boxes=np.ones(8, np.float32)),  # dimensions that are not
            dict(good, rating=np.float64(4.5)), dict(good, rating=np.ones(1, np.float32)),
            dict(good, extra=np.ones(1)), {k: v for k, v in good.items() if k != "boxes"},
            {"image": good["image"], "boxes": good["boxes"], "ratings": good["rating"]},
            dict(good, image=None), [good["image"]],
            dict(good, boxes=np.ones((2, 4), ">f4")),  # another byte order
            dict(good, image=np.zeros((3, 4, 8), np.uint8)[:, :, ::2]),  # not contiguous
            dict(good, boxes=np.array(1.0, np.float32))]  # 0-d for a ragged field
    return out


@pytest.mark.parametrize("index", range(len(_variants())))
def test_the_cheap_check_gives_what_the_general_one_gives(index: int) -> None:
    value = _variants()[index]
    fast = _outcome(record_checker(SCHEMA), value)
    slow = _outcome(lambda key, v: check_record(key, v, SCHEMA), value)
    assert fast[0] == slow[0], (fast, slow)
    if fast[0] != "ok":
        assert fast[1] == slow[1]  # the same message: key, field, what was expected and came
        return
    assert list(fast[1]) == [n for n, _f in SCHEMA]
    for name in fast[1]:
        a, b = fast[1][name], slow[1][name]
        assert type(a) is np.ndarray and type(b) is np.ndarray
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_records_of_the_schema_are_taken_as_they_are_and_others_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = record_checker(SCHEMA)
    good = _good()
    with monkeypatch.context() as patched:  # the general check is not what takes them
        patched.setattr(records, "check_record", lambda *a: pytest.fail("general check"))
        got = check("k/1.bin", good)
        check("k/1.bin", dict(good, boxes=np.zeros((0, 4), np.float32)))
    assert got["image"] is good["image"] and got["boxes"] is good["boxes"]  # no copy
    assert got["rating"].shape == () and got["rating"].dtype == np.float32
    with pytest.raises(TypeError, match=r"'k/2.bin': field 'image' must be uint8.*int16"):
        check("k/2.bin", dict(good, image=good["image"].astype(np.int16)))
    with pytest.raises(ValueError, match=r"'k/3.bin': field 'boxes' must have shape \(None, 4\)"):
        check("k/3.bin", dict(good, boxes=np.ones((2, 3), np.float32)))


def test_a_schema_with_text_and_tuples_with_names_are_checked_too() -> None:
    schema: Schema = (("title", tsc.Text()), ("rating", tsc.Fixed((), "float32")))
    check = record_checker(schema, ("title", "rating"))
    got = check("k/4.bin", ("héllo", np.float32(2)))
    assert got["title"].tobytes() == "héllo".encode() and float(got["rating"]) == 2.0
    with pytest.raises(TypeError, match=r"'k/5.bin': field 'title' is text"):
        check("k/5.bin", {"title": b"raw", "rating": np.float32(2)})
