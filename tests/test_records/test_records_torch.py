"""StoreDataset over a store of records: padded, packed and nested ragged fields, workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import tensorstore_cache as tsc  # noqa: E402
from tensorstore_cache.torch import StoreDataset, StoreSampler, collate  # noqa: E402

from ..support._records import BOX_FIELDS, RecordLoader, expected, write_sources  # noqa: E402

N = 96


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tsc.CacheStore:
    base = tmp_path_factory.mktemp("records-torch")
    paths = write_sources(base / "src", N)
    return tsc.build_store(paths, base / "r.tsc", loader=RecordLoader(boxes=True),
                           loader_id="records/1", fields=BOX_FIELDS, workers=1, progress=False)


def _want(store: tsc.CacheStore, rows: Any) -> list[dict[str, Any]]:
    return [expected(str(Path(store.location).parent / "src" / f"{int(r)}.bin"), boxes=True)
            for r in np.asarray(rows).tolist()]


def test_an_item_is_a_dict_of_zero_copy_tensors(store: tsc.CacheStore) -> None:
    ds = StoreDataset(store, targets=np.arange(N, dtype=np.float32))
    item, y = ds[5]
    assert list(item) == ["image", "title_ids", "rating", "boxes", "pic"]  # no text by default
    want = _want(store, [store.rows([store.paths[5]])[0]])[0]
    for name, value in item.items():
        np.testing.assert_array_equal(value.numpy(), want[name])
    assert float(y) == 5.0
    base = item["title_ids"].numpy().base
    assert base is not None  # a view of the mapped values


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_padded_batches_with_a_plain_dataloader(store: tsc.CacheStore, context: str) -> None:
    ds = StoreDataset(store, fields=["image", "title_ids", "title", "boxes"], pad_value=-1)
    loader = DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context=context)
    seen = 0
    for i, batch in enumerate(loader):
        rows = ds.rows[i * 16 : (i + 1) * 16]
        want = _want(store, rows)
        assert set(batch) == {"image", "title_ids", "title_ids_len", "title", "boxes", "boxes_len"}
        np.testing.assert_array_equal(batch["image"].numpy(), np.stack([w["image"] for w in want]))
        lengths = [len(w["title_ids"]) for w in want]
        assert batch["title_ids_len"].tolist() == lengths
        assert batch["title_ids"].shape == (len(rows), max(lengths))
        for j, w in enumerate(want):
            np.testing.assert_array_equal(batch["title_ids"][j, : lengths[j]].numpy(), w["title_ids"])
            assert (batch["title_ids"][j, lengths[j] :] == -1).all()
            k = len(w["boxes"])
            np.testing.assert_array_equal(batch["boxes"][j, :k].numpy(), w["boxes"])
            assert (batch["boxes"][j, k:] == -1).all()
        assert batch["title"] == [w["title"] for w in want]
        seen += len(rows)
    assert seen == N


def test_every_varying_dimension_is_padded(store: tsc.CacheStore) -> None:
    ds = StoreDataset(store, fields=["pic"])
    batch = ds.batch(np.arange(12))
    want = _want(store, ds.rows[:12])
    hs, ws = [w["pic"].shape[1] for w in want], [w["pic"].shape[2] for w in want]
    assert batch["pic"].shape == (12, 3, max(hs), max(ws)) and batch["pic_len"].tolist() == hs
    for j, w in enumerate(want):
        np.testing.assert_array_equal(batch["pic"][j, :, : hs[j], : ws[j]].numpy(), w["pic"])
        assert int(batch["pic"][j, :, hs[j] :, :].sum()) == 0
    with pytest.raises(ValueError, match="pad value -1 does not fit"):
        StoreDataset(store, fields=["pic"], pad_value=-1).batch(np.arange(4))


def test_packed_and_nested_batches_need_the_collate(store: tsc.CacheStore) -> None:
    packed = StoreDataset(store, fields=["title_ids", "boxes"], ragged="packed")
    batch = next(iter(DataLoader(packed, batch_size=10, collate_fn=collate)))
    want = _want(store, packed.rows[:10])
    offsets = batch["title_ids_offsets"]
    assert offsets.dtype == torch.int32 and offsets.tolist()[0] == 0 and len(offsets) == 11
    np.testing.assert_array_equal(batch["title_ids"].numpy(),
                                  np.concatenate([w["title_ids"] for w in want]))
    assert batch["boxes"].shape == (sum(len(w["boxes"]) for w in want), 4)
    with pytest.raises(TypeError, match=r"collate_fn=tensorstore_cache.torch.collate"):
        next(iter(DataLoader(packed, batch_size=10)))
    nested = StoreDataset(store, fields=["title_ids"], ragged="nested")
    got = next(iter(DataLoader(nested, batch_size=10, collate_fn=collate)))["title_ids"]
    assert got.is_nested and got.size(0) == 10
    for j, w in enumerate(want):
        np.testing.assert_array_equal(got[j].numpy(), w["title_ids"])
    with pytest.raises(TypeError, match="nested"):
        next(iter(DataLoader(StoreDataset(store, fields=["pic"], ragged="nested"), batch_size=4,
                             collate_fn=collate)))
    with pytest.raises(TypeError, match=r"ragged='packed'.*'pic'"):  # its shapes would be lost
        next(iter(DataLoader(StoreDataset(store, fields=["pic"], ragged="packed"), batch_size=4,
                             collate_fn=collate)))


def test_one_gather_per_field_per_batch(store: tsc.CacheStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ragged data once formatted must not become a list of tensors per row (datasets#7210,
    #5841): one gather per field per batch."""
    ds = StoreDataset(store, fields=["image", "title_ids", "rating"])
    gathers: list[int] = []
    take = tsc.CacheStore.take

    def counting(self: tsc.CacheStore, rows: Any, out: Any = None) -> Any:
        gathers.append(len(rows))
        return take(self, rows, out)

    monkeypatch.setattr(tsc.CacheStore, "take", counting)
    for _batch in ds.dataloader(32):
        pass
    assert gathers == [32] * 9  # 3 batches x 3 fields, each one take of the whole batch


def test_field_batch_transforms_and_resume(store: tsc.CacheStore) -> None:
    ds = StoreDataset(store, targets=np.arange(N, dtype=np.int64), fields=["image", "title_ids"])

    def flip(x: Any) -> Any:
        return torch.flip(x, dims=[-1])

    sampler = StoreSampler(N, global_batch_size=16, seed=3)
    loader = ds.dataloader(sampler=sampler, batch_transform={"image": flip}, num_workers=2)
    first = [(x["image"].clone(), y.clone()) for x, y in loader]
    for (x, y) in first:
        want = np.stack([w["image"] for w in _want(store, ds.rows[y.numpy()])])
        np.testing.assert_array_equal(x.numpy(), want[..., ::-1])
    # resume mid-epoch: the same batches
    loader = ds.dataloader(sampler=StoreSampler(N, global_batch_size=16, seed=3),
                           batch_transform={"image": flip})
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    again = ds.dataloader(sampler=StoreSampler(N, global_batch_size=16, seed=3),
                          batch_transform={"image": flip})
    again.load_state_dict(state)
    rest = [y.clone() for _x, y in again]
    assert [r.tolist() for r in rest] == [y.tolist() for _x, y in first[2:]]


def test_options_that_do_not_apply_to_records_are_refused(store: tsc.CacheStore) -> None:
    with pytest.raises(TypeError, match="as_float"):
        StoreDataset(store, as_float=True)
    with pytest.raises(TypeError, match="batch_transform"):
        StoreDataset(store, transform=lambda x: x)
    with pytest.raises(KeyError, match="no field 'nope'"):
        StoreDataset(store, fields=["nope"])
    ds = StoreDataset(store)
    with pytest.raises(TypeError, match=r"batch_transform=\{field: fn\}"):
        ds.dataloader(8, batch_transform=lambda x: x)
    images = StoreDataset(store.field("image"), as_float=True)  # one field: the tensor API
    assert images[0].dtype == torch.float32 and images[0].shape == (3, 4, 4)


def test_torch_default_collate_takes_a_batch_of_records_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset of ``store[key]`` with torch's default collate: every field collated once
    (a copy of a record is a plain dict that the collate may update), into a dict."""
    import torch.utils.data._utils.collate as torch_collate

    calls: list[int] = []
    real = torch_collate.default_collate_fn_map[np.ndarray]

    def counting(batch: Any, *, collate_fn_map: Any = None) -> Any:
        calls.append(len(batch))
        return real(batch, collate_fn_map=collate_fn_map)

    monkeypatch.setitem(torch_collate.default_collate_fn_map, np.ndarray, counting)
    records = [tsc.Record({"image": np.full((3, 2, 2), i, np.uint8),
                           "rating": np.array(i / 2, np.float32)}) for i in range(4)]
    batch = torch.utils.data.default_collate(records)
    assert calls == [4, 4]  # once per field
    assert type(batch) is dict and list(batch) == ["image", "rating"]
    assert batch["image"].shape == (4, 3, 2, 2) and batch["rating"].tolist() == [0, 0.5, 1, 1.5]
