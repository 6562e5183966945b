"""The library used where its users write code, with real processes and ``workers=2``.

* Scripts without a ``__main__`` guard, run as ``python script.py``,
  ``python - < script.py`` and ``python -c "..."``, calling ``cached()`` or
  ``build_store``: the build's workers never run the script again, nothing
  hangs, the pool's worker really computes part of the items.
* The README's "Getting started", verbatim, as a plain script.
* Every kind of loader a user writes, sent to the pool's worker.
* A real notebook kernel (nbclient + ipykernel) whose cell defines the loader.
* A real Optuna study run by 4 agent processes at once.
* torch DataLoader workers (fork and spawn) that open the store by path, and
  DataLoader workers (daemonic) that build it themselves, in-process.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import tensorstore_cache as tsc

from ..support._clients import LOG_ENV, REPO, LoggedImages, calls, environment, expected, python

TIMEOUT_S = 180  # a guard against hangs, not a timing assertion


def _paths_file(tmp_path: Path, paths: list[str]) -> Path:
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(paths))
    return listing


def _run(args: list[str], cwd: Path, stdin: str | None = None, **env: str) -> str:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=cwd,
                          timeout=TIMEOUT_S, env=environment(**env))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def _assert_built_by_two_processes(log: Path, paths: list[str], builder: int) -> None:
    """Every item computed once, by the building process and by a worker of its pool."""
    logged = calls(log)
    counts = Counter(key for _pid, key in logged)
    assert set(counts) == set(paths) and set(counts.values()) == {1}, counts.most_common(3)
    pids = {pid for pid, _key in logged}
    assert builder in pids and len(pids) == 2, (builder, pids)


# -- scripts without a main guard ---------------------------------------------------

_SCRIPT_BODY = '''
import os

import numpy as np

import tensorstore_cache as tsc


def load(path):  # a function of __main__: the pool's worker receives it by value
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{os.getpid()} {path}\\n".encode())
    os.close(fd)
    return tsc.ImageLoader(size=(8, 8))(path)


paths = open(PATHS).read().splitlines()
print("RUN", os.getpid(), flush=True)
'''

_CALLS = {
    "cached": 'store = tsc.cached(paths, cache_dir=WHERE, loader=load, loader_id="script.load/1", '
              "workers=2, progress=False)\n",
    "build_store": 'store = tsc.build_store(paths, WHERE, loader=load, loader_id="script.load/1", '
                   "workers=2, progress=False)\n",
}


@pytest.mark.parametrize("how", ["file", "stdin", "-c"])
@pytest.mark.parametrize("call", ["cached", "build_store"])
def test_script_without_main_guard(
    tmp_path: Path, client_images: list[str], call: str, how: str
) -> None:
    log, out = tmp_path / "calls.log", tmp_path / "out.npy"
    where = tmp_path / ("cache" if call == "cached" else "covers.tsc")
    head = (f"LOG, PATHS, OUT, WHERE = {str(log)!r}, "
            f"{str(_paths_file(tmp_path, client_images))!r}, {str(out)!r}, {str(where)!r}\n")
    script = head + _SCRIPT_BODY + _CALLS[call] + 'np.save(OUT, store.stack(paths))\n' \
        'print("DONE", len(store), flush=True)\n'
    if how == "file":
        (tmp_path / "train.py").write_text(script)
        stdout = _run([python(), "train.py"], tmp_path)
    elif how == "stdin":
        stdout = _run([python(), "-"], tmp_path, stdin=script)
    else:
        stdout = _run([python(), "-c", script], tmp_path)
    runs = re.findall(r"^RUN (\d+)$", stdout, re.M)
    assert len(runs) == 1, f"the script ran {len(runs)} times:\n{stdout}"  # workers never rerun it
    assert "DONE 150" in stdout, stdout
    np.testing.assert_array_equal(np.load(out), expected(client_images))
    _assert_built_by_two_processes(log, client_images, int(runs[0]))


def test_readme_getting_started_runs_as_a_plain_script(
    tmp_path: Path, client_images: list[str]
) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("torch")
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Getting started", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = rng.choice(client_images, 400)  # paths repeat, in no order
    pd.DataFrame({"img_path": rows, "rating": rng.integers(1, 11, len(rows))}).to_csv(
        tmp_path / "train_ratings.csv", index=False)
    script = code.group(1) + (
        "\nassert x.shape == (len(df), 3, 32, 32)"
        "\nfirst = df['img_path'][0]"
        "\nassert g[first].shape == (16, 16) and (g[first] == grey(first)).all()"
        "\nassert xb.shape[1:] == (3, 32, 32)"
        "\nprint('GETTING STARTED', len(store), x.sum())\n"
    )
    (tmp_path / "getting_started.py").write_text(script)
    stdout = _run([python(), "getting_started.py"], tmp_path, TSC_CACHE_DIR=str(tmp_path / "c"))
    got = re.search(r"GETTING STARTED (\d+) (\S+)", stdout)
    assert got is not None, stdout
    assert int(got.group(1)) == len(set(rows))
    image = tsc.ImageLoader(size=(32, 32))
    want = np.stack([image(p) for p in rows]).sum()
    assert float(got.group(2)) == pytest.approx(float(want), rel=1e-5)


# -- every kind of loader --------------------------------------------------------------

_LOG_CALL = '''
def log_call(path):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{os.getpid()} {path}\\n".encode())
    os.close(fd)
'''

_KINDS = {
    "module-function": "from tests.support._clients import logged_image as load\n",
    "main-function": _LOG_CALL + '''
def load(path):
    log_call(path)
    return tsc.ImageLoader(size=(8, 8))(path)
''',
    "lambda": _LOG_CALL + '''
load = lambda path: (log_call(path), tsc.ImageLoader(size=(8, 8))(path))[1]  # noqa: E731
''',
    "closure": '''
def make_loader(log, size):
    image = tsc.ImageLoader(size=size)

    def load(path):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{os.getpid()} {path}\\n".encode())
        os.close(fd)
        return image(path)

    return load


load = make_loader(LOG, (8, 8))
''',
    "partial": '''
def make_loader():
    def resize(path, log, size):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{os.getpid()} {path}\\n".encode())
        os.close(fd)
        return tsc.ImageLoader(size=size)(path)

    return functools.partial(resize, log=LOG, size=(8, 8))


load = make_loader()
''',
    "callable-instance": _LOG_CALL + '''
class Thumbnails:
    def __init__(self, size):
        self.image = tsc.ImageLoader(size=size)

    def __call__(self, path):
        log_call(path)
        return self.image(path)


load = Thumbnails((8, 8))
''',
}


@pytest.mark.parametrize("kind", list(_KINDS))
def test_every_loader_kind_works_with_two_workers(
    tmp_path: Path, client_images: list[str], kind: str
) -> None:
    log, out = tmp_path / "calls.log", tmp_path / "out.npy"
    script = (
        "import functools\nimport os\n\nimport numpy as np\n\nimport tensorstore_cache as tsc\n"
        f"LOG, PATHS, OUT = {str(log)!r}, {str(_paths_file(tmp_path, client_images))!r}, "
        f"{str(out)!r}\n"
        + _KINDS[kind]
        + "paths = open(PATHS).read().splitlines()\n"
        f"store = tsc.cached(paths, cache_dir='cache', loader=load, loader_id='kind.{kind}/1', "
        "workers=2, progress=False)\n"
        "np.save(OUT, store.stack(paths))\n"
        "print('BUILDER', os.getpid())\n"
    )
    (tmp_path / "kind.py").write_text(script)
    stdout = _run([python(), "kind.py"], tmp_path, **{LOG_ENV: str(log)})
    builder = re.search(r"BUILDER (\d+)", stdout)
    assert builder is not None, stdout
    np.testing.assert_array_equal(np.load(out), expected(client_images))
    _assert_built_by_two_processes(log, client_images, int(builder.group(1)))


def test_the_loader_travels_once_per_worker(tmp_path: Path) -> None:
    """Pickled once by the builder, unpickled once by each worker, whatever the task count."""
    from ..support._clients import CountsItsTrips

    log = tmp_path / "trips.log"
    keys = [f"k{i}" for i in range(640)]  # 10 shards of 64 rows
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=CountsItsTrips(str(log)),
                            workers=3, progress=False, identity="none")
    np.testing.assert_array_equal(store.take(np.arange(640))[:, 0], np.arange(640))
    trips = calls(log)
    assert [pid for pid, what in trips if what == "pickled"] == [os.getpid()]
    arrived = [pid for pid, what in trips if what == "arrived"]
    assert len(arrived) == len(set(arrived)) == 2 and os.getpid() not in arrived, trips


# -- a notebook ------------------------------------------------------------------------

def test_notebook_cell_defines_the_loader(
    tmp_path: Path, client_images: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                     ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_CONFIG_DIR", "config")):
        (tmp_path / "jupyter" / sub).mkdir(parents=True)
        monkeypatch.setenv(var, str(tmp_path / "jupyter" / sub))  # never the user's home
    log, out = tmp_path / "calls.log", tmp_path / "out.npy"
    cell = (
        "import os\nimport numpy as np\nimport tensorstore_cache as tsc\n\n"
        f"LOG = {str(log)!r}\n"
        f"paths = open({str(_paths_file(tmp_path, client_images))!r}).read().splitlines()\n\n"
        "def load(path):\n"
        "    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n"
        "    os.write(fd, f'{os.getpid()} {path}\\n'.encode())\n"
        "    os.close(fd)\n"
        "    return tsc.ImageLoader(size=(8, 8))(path)\n\n"
        "store = tsc.cached(paths, cache_dir='cache', loader=load, loader_id='notebook/1',\n"
        "                   workers=2, progress=False)\n"
        f"np.save({str(out)!r}, store.stack(paths))\n"
        "print('KERNEL', os.getpid(), len(store))\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    kernel = re.search(r"KERNEL (\d+) 150", text)
    assert kernel is not None, outputs
    np.testing.assert_array_equal(np.load(out), expected(client_images))
    _assert_built_by_two_processes(log, client_images, int(kernel.group(1)))


# -- an Optuna study -------------------------------------------------------------------

_AGENT = '''
import hashlib
import os

import numpy as np
import optuna
import torch

import tensorstore_cache as tsc

optuna.logging.set_verbosity(optuna.logging.WARNING)
torch.set_num_threads(1)
storage = optuna.storages.RDBStorage(URL, engine_kwargs={"connect_args": {"timeout": 120}})
study = optuna.load_study(study_name="covers", storage=storage)
paths = open(PATHS).read().splitlines()


def load(path):  # the sweep's preprocessing, defined in the agent's script
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{os.getpid()} {path}\\n".encode())
    os.close(fd)
    return tsc.ImageLoader(size=(8, 8))(path)


def objective(trial):
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    store = tsc.cached(paths, cache_dir=CACHE, loader=load, loader_id="sweep.covers/1",
                       workers=2, progress=False)
    x = torch.from_numpy(store.stack(paths)).flatten(1)
    trial.set_user_attr("digest", hashlib.sha256(x.numpy().tobytes()).hexdigest())
    trial.set_user_attr("pid", os.getpid())
    y = x.mean(dim=1, keepdim=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    store.close()
    return float(loss)


study.optimize(objective, n_trials=TRIALS)
print("AGENT DONE", os.getpid(), flush=True)
'''


def test_optuna_study_of_four_agents_computes_every_item_once(
    tmp_path: Path, client_images: list[str]
) -> None:
    optuna = pytest.importorskip("optuna")
    pytest.importorskip("torch")
    log, trials = tmp_path / "calls.log", 3
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 120}})
    optuna.create_study(study_name="covers", storage=storage)  # once, before the agents
    (tmp_path / "tune.py").write_text(
        f"URL, PATHS, LOG, CACHE, TRIALS = {url!r}, "
        f"{str(_paths_file(tmp_path, client_images))!r}, {str(log)!r}, "
        f"{str(tmp_path / 'cache')!r}, {trials}\n" + _AGENT
    )
    agents = [subprocess.Popen([python(), "tune.py"], cwd=tmp_path, env=environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    try:
        results = [a.communicate(timeout=TIMEOUT_S) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    for a, (out, err) in zip(agents, results, strict=True):
        assert a.returncode == 0 and "AGENT DONE" in out, err
    study = optuna.load_study(study_name="covers", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == len(study.trials) == 4 * trials
    assert len({t.user_attrs["pid"] for t in done}) == 4
    want = hashlib.sha256(expected(client_images).reshape(len(client_images), -1)
                          .tobytes()).hexdigest()
    assert {t.user_attrs["digest"] for t in done} == {want}, "every trial sees the same data"
    counts = Counter(key for _pid, key in calls(log))
    assert set(counts) == set(client_images) and set(counts.values()) == {1}
    builders = {pid for pid, _key in calls(log)}
    assert len(builders) == 2, builders  # one agent and the worker of its pool


# -- torch DataLoader workers ----------------------------------------------------------

@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_open_the_store_by_path(
    tmp_path: Path, client_images: list[str], method: str
) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from ..support._clients import ByPath, open_by_path

    log = tmp_path / "calls.log"
    store = tsc.cached(client_images, cache_dir=tmp_path / "cache", loader=LoggedImages(log),
                       workers=2, progress=False)
    _assert_built_by_two_processes(log, client_images, os.getpid())
    ds = ByPath(store.location, client_images)
    loader: Any = DataLoader(cast(Any, ds), batch_size=16, num_workers=2,
                             multiprocessing_context=method, worker_init_fn=open_by_path)
    seen, pids = [], set()
    for index, batch, pid in loader:
        np.testing.assert_array_equal(batch.numpy(), expected([client_images[i] for i in index]))
        seen.extend(index.tolist())
        pids.update(pid.tolist())
    assert sorted(seen) == list(range(len(client_images)))
    assert len(pids) == 2 and os.getpid() not in pids


_DAEMONIC = '''
from torch.utils.data import DataLoader

from tests.support._clients import BuildInWorker, cached_in_worker, expected

paths = open(PATHS).read().splitlines()
loader = DataLoader(BuildInWorker(CACHE, paths, LOG), batch_size=16, num_workers=2,
                    multiprocessing_context="fork", worker_init_fn=cached_in_worker)
pids = set()
for index, batch, pid in loader:
    assert (batch.numpy() == expected([paths[i] for i in index])).all()
    pids.update(pid.tolist())
print("WORKERS", *sorted(pids))
'''


def test_dataloader_workers_build_in_process_when_daemonic(
    tmp_path: Path, client_images: list[str]
) -> None:
    """cached(workers=2) inside DataLoader workers, which may not start processes."""
    pytest.importorskip("torch")
    log = tmp_path / "calls.log"
    (tmp_path / "train.py").write_text(
        f"CACHE, PATHS, LOG = {str(tmp_path / 'cache')!r}, "
        f"{str(_paths_file(tmp_path, client_images))!r}, {str(log)!r}\n" + _DAEMONIC
    )
    proc = subprocess.run([python(), "train.py"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=TIMEOUT_S, env=environment())
    assert proc.returncode == 0, proc.stderr
    workers = re.search(r"WORKERS (\d+) (\d+)$", proc.stdout, re.M)
    assert workers is not None, proc.stdout
    logged = calls(log)
    counts = Counter(key for _pid, key in logged)
    assert set(counts) == set(client_images) and set(counts.values()) == {1}
    (builder,) = {pid for pid, _key in logged}  # one DataLoader worker built, in this process
    assert builder in {int(workers.group(1)), int(workers.group(2))}
    # the other worker waited for it and opened its result; one line says why no pool
    notices = [line for line in proc.stderr.splitlines() if "daemonic" in line]
    assert notices == [
        f"tensorstore_cache: building {notices[0].split()[2]} in this process (workers=1): "
        "a daemonic process (a DataLoader or multiprocessing pool worker) cannot start worker "
        "processes"
    ], proc.stderr
    store = tsc.cached(client_images, cache_dir=tmp_path / "cache", loader=LoggedImages(log),
                       progress=False)  # the workers' build is the cache, complete
    np.testing.assert_array_equal(store.stack(client_images), expected(client_images))
    assert len(calls(log)) == len(client_images)
