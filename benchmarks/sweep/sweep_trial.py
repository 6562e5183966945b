"""One trial of the sweep: a fresh ``python`` process, as a sweep agent starts for each run.

``python -m benchmarks.sweep.sweep_trial SPEC.json`` (started by :mod:`benchmarks.sweep`, which
asked Optuna for the trial's hyperparameters and writes them into the spec). The trial:

1. volunteers for the OOM killer (``/proc/self/oom_score_adj`` = 1000), imports its
   libraries (timed apart: interpreter start-up and imports are not "getting data");
2. reads the ratings tables and gets the vector of every row through the method under
   test: the train covers, then the test covers with a second call (for
   ``tensorstore_cache``, two ``tsc.cached()`` calls, the second adding the test covers
   to the cache incrementally; ``tensorstore_cache_none`` makes the same calls with
   ``identity="none"``: no ``stat`` of the sources);
3. trains a small CNN rating regressor (the original solution's image branch) on
   3x32x32 vectors for at most ``steps`` batches of one epoch, batches drawn by a
   ``DataLoader`` with a seeded shuffle: through ``StoreDataset`` for tensorstore_cache,
   through a Dataset over the method's own in-memory data for the baselines;
4. reports the validation RMSE and the mean prediction on test rows, with timestamps.

Every trial of every method sees the same rows, the same initial weights and the same
batch order, and torch runs deterministically on one thread: a configuration reaches the
same RMSE whatever the method, so only the caching differs. Decoding is counted inside
the loader (:class:`benchmarks.sweep._decode_meter.DecodeMeter`), wherever it runs.
"""

from __future__ import annotations

import time

T_MAIN = time.time()  # the interpreter is up and running this module

import argparse  # noqa: E402  (the clock above must start first)
import base64  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks.common._memory import set_oom_score_adj  # noqa: E402

#: environment variable that carries the Manager's authentication key (never on disk)
AUTHKEY_ENV = "SWEEP_MANAGER_AUTHKEY"
#: libraries each method's trial imports besides numpy, pandas, torch, tensorstore_cache
MODULES: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "no_cache": ("benchmarks.common.methods.no_cache",),
    "manager_vectors": ("multiprocessing.managers", "benchmarks.common.methods.manager_vectors"),
    "torch_save": ("benchmarks.common.methods.torch_save",),
    "hf_datasets": ("datasets", "benchmarks.common.methods.hf_datasets"),
    "tensorstore_cache": ("tensorstore_cache.torch",),
    "tensorstore_cache_none": ("tensorstore_cache.torch",),
}
#: the tensorstore_cache methods and how each knows its entries are current
TSC_IDENTITY = {"tensorstore_cache": "stat", "tensorstore_cache_none": "none"}
EVAL_BATCH = 512


class RowsDataset:
    """A baseline's Dataset: the vectors of the rows of a ratings table.

    ``rows[i]`` is the position of row ``i``'s cover in the column the method returned
    (one vector per unique cover). Indexed with a list of indices (a ``BatchSampler``),
    it returns the whole batch ``(x, y)`` (or ``x``): from the column's in-memory list of
    arrays when it has one (no cache, Manager dict, ``torch.save``: what the original
    merged into its DataFrame), else through the column's own batch read (Arrow).
    """

    def __init__(self, column: Any, rows: Any, targets: Any = None) -> None:
        self.column = column
        self.vectors = getattr(column, "vectors", None)
        self.rows = rows
        self.targets = targets

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: list[int]) -> Any:
        import numpy as np
        import torch

        rows = self.rows[index]
        if self.vectors is not None:
            vectors = self.vectors
            x = np.stack([vectors[r] for r in rows.tolist()])
        else:
            x = self.column.batch(rows)
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if self.targets is None:
            return xt
        return xt, torch.from_numpy(self.targets[index])


def cover_cnn() -> Any:
    """The original solution's image branch (two strided convolutions) and a linear head."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 6, kernel_size=3, stride=2, padding=1), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(6, 12, kernel_size=3, stride=2, padding=1), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1),
    )


def batches(ds: Any, batch_size: int, seed: int | None = None) -> Any:
    """A DataLoader drawing whole batches of indices, shuffled by ``seed`` if given.

    The sampler of ``StoreDataset.dataloader(batch_size, shuffle=True, seed=seed)``: with
    the same seed, every method's trial sees the same batches in the same order.
    """
    from torch.utils.data import DataLoader

    from tensorstore_cache.torch import StoreSampler

    sampler = StoreSampler(len(ds), global_batch_size=batch_size, seed=seed or 0,
                           shuffle=seed is not None, drop_last=False, rank=0, world_size=1)
    return DataLoader(ds, batch_size=None, sampler=sampler)


def _positions(unique: list[str], paths: Any) -> Any:
    import numpy as np
    import pandas as pd

    pos = pd.Index(unique).get_indexer(paths)
    return np.asarray(pos, dtype=np.int64)


def _method_state(method: str, state: dict[str, Any]) -> dict[str, Any]:
    if method != "manager_vectors":
        return state
    import multiprocessing
    import pickle

    multiprocessing.current_process().authkey = bytes.fromhex(os.environ[AUTHKEY_ENV])
    return {"shared": pickle.loads(base64.b64decode(state["shared"]))}


def get_data(spec: dict[str, Any], tables: dict[str, Any], meter: Any,
             result: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """Get the vectors of the train and test tables' covers through the method.

    Returns the train loader (fit rows), the validation and test-row datasets, and what
    must stay alive while they are used.
    """
    import numpy as np

    import tensorstore_cache as tsc

    method = spec["method"]
    train, test = tables["train"], tables["test"]
    fit, val, test_rows = tables["fit"], tables["val"], tables["test_rows"]
    seed = int(spec["seed"])
    bs = int(spec["params"]["batch_size"])
    fit_y = fit["rating"].to_numpy(np.float32)
    val_y = val["rating"].to_numpy(np.float32)
    if method in TSC_IDENTITY:
        from tensorstore_cache.torch import StoreDataset

        kwargs = {"cache_dir": spec["state"]["cache_dir"], "loader": meter,
                  "loader_id": meter.loader_id, "progress": False,
                  "identity": TSC_IDENTITY[method]}
        store = tsc.cached(train["img_path"], **kwargs)
        test_store = tsc.cached(test["img_path"], **kwargs)  # adds the test covers
        result["t_vectors"] = time.time()
        fit_ds = StoreDataset(store, fit["img_path"], targets=fit_y)
        val_ds = StoreDataset(store, val["img_path"], targets=val_y)
        test_ds = StoreDataset(test_store, test_rows["img_path"])
        return fit_ds.dataloader(bs, shuffle=True, seed=seed), val_ds, test_ds, \
            (store, test_store)
    module = importlib.import_module(MODULES[method][-1])
    impl = module.METHOD
    state = _method_state(method, spec["state"])
    columns = []
    for split, table in (("train", train), ("test", test)):
        unique = table["img_path"].drop_duplicates().tolist()  # the original's img_vector_df
        split_state = dict(state, **spec.get("split_state", {}).get(split, {}))
        column = impl.load(split_state, unique, meter)
        result[f"{split}_hit"] = bool(column.hit)
        columns.append((unique, column))
    result["t_vectors"] = time.time()
    (train_unique, train_col), (test_unique, test_col) = columns
    fit_rows = RowsDataset(train_col, _positions(train_unique, fit["img_path"]), fit_y)
    val_rows = RowsDataset(train_col, _positions(train_unique, val["img_path"]), val_y)
    test_rows_ds = RowsDataset(test_col, _positions(test_unique, test_rows["img_path"]))
    return batches(fit_rows, bs, seed), val_rows, test_rows_ds, columns


def _eval(model: Any, ds: Any, method: str) -> Any:
    import torch

    loader = ds.dataloader(EVAL_BATCH) if method in TSC_IDENTITY else \
        batches(ds, EVAL_BATCH)
    preds, targets = [], []
    with torch.no_grad():
        for batch in loader:
            x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
            preds.append(model(x).squeeze(1).double())
            if y is not None:
                targets.append(y.double())
    pred = torch.cat(preds) if preds else torch.zeros(0, dtype=torch.float64)
    return pred, (torch.cat(targets) if targets else None)


def _proc_figures() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                key, value = line.split(":")
                if key in ("write_bytes", "cancelled_write_bytes", "read_bytes"):
                    out[key] = int(value)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    out["peak_rss_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def run(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """The trial itself; fills ``result``."""
    method = spec["method"]
    import numpy as np
    import pandas as pd
    import torch

    import tensorstore_cache as tsc

    for name in MODULES[method]:
        importlib.import_module(name)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    result["t_imported"] = time.time()
    if spec.get("fault") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if spec.get("fault") == "raise":
        raise RuntimeError("fault injected by the sweep's --inject-fault")

    from benchmarks.sweep._decode_meter import DecodeMeter

    meter = DecodeMeter(tsc.ImageLoader((32, 32)), spec["decode_log"])
    seed = int(spec["seed"])
    params = spec["params"]
    torch.manual_seed(seed)
    model = cover_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=float(params["lr"]))
    steps = int(spec["steps"])
    train = pd.read_csv(spec["train_table"])
    test = pd.read_csv(spec["test_table"])
    result["t_table"] = time.time()
    perm = np.random.default_rng(seed).permutation(len(train))
    n_val = max(1, int(len(train) * spec["val_fraction"]))
    fit = train.iloc[np.sort(perm[n_val:])]
    val = train.iloc[np.sort(perm[:n_val])].iloc[: spec["eval_rows"]]
    tables = {"train": train, "test": test, "fit": fit, "val": val,
              "test_rows": test.iloc[: spec["eval_rows"]]}
    result["train_rows"], result["test_rows"] = len(train), len(test)
    if method == "baseline":  # the same imports, tables and training without vectors:
        gen = torch.Generator().manual_seed(seed)  # what an agent costs by itself

        def synthetic() -> Any:
            for _ in range(steps):
                bs = int(params["batch_size"])
                yield torch.rand(bs, 3, 32, 32, generator=gen), torch.rand(bs, generator=gen)

        result["t_vectors"] = time.time()
        train_iter, val_ds, test_ds, held = iter(synthetic()), None, None, None
    else:
        loader, val_ds, test_ds, held = get_data(spec, tables, meter, result)
        train_iter = iter(loader)
    x, y = next(train_iter)
    result["t_first_batch"] = time.time()
    done = items = 0
    loss_value = float("nan")
    while True:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        done += 1
        items += len(y)
        loss_value = float(loss)
        if done >= steps:
            break
        try:
            x, y = next(train_iter)
        except StopIteration:  # one epoch at most
            break
    result["t_trained"] = time.time()
    result.update(steps_done=done, items_trained=items, last_loss=loss_value)
    if val_ds is not None:
        model.eval()
        pred, target = _eval(model, val_ds, method)
        result["val_rmse"] = float(torch.sqrt(torch.mean((pred - target) ** 2)))
        result["val_rows"] = len(target)
        test_pred, _ = _eval(model, test_ds, method)
        result["test_pred_mean"] = float(test_pred.mean())
        result["test_rows_predicted"] = len(test_pred)
    del held
    result["t_end"] = time.time()
    result.update(_proc_figures())


def _write(path: str, result: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep.sweep_trial", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path, metavar="SPEC.json",
                        help="the trial's spec, written by python -m benchmarks.sweep")
    args = parser.parse_args(argv)
    set_oom_score_adj(1000)  # the kernel takes a trial first, never the driver
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    result: dict[str, Any] = {"pid": os.getpid(), "t_main": T_MAIN, "method": spec["method"],
                              "number": spec["number"], "params": spec["params"]}
    try:
        run(spec, result)
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        result["traceback"] = traceback.format_exc()
        _write(spec["result"], result)
        raise
    _write(spec["result"], result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
