"""The code blocks of ``README.md`` and ``docs/*.md``: found, classified and run.

Every fenced block has a language. ``python`` blocks and shell blocks
(``bash``, ``console``: the ``$ `` lines only) are examples: each page's run
in order, in one fresh process, the Python blocks sharing one namespace (as
in a notebook), in a working directory that holds what the pages read
(:func:`make_workdir`). Other languages (``text``, ``json``...) are shown,
not run.

A block that cannot run here says so on the line before its fence, with the
reason, which the tests list:

``<!-- not run: REASON -->``
    shown only (a ``pip install``, a server this machine does not have).
``<!-- run with: NAME -->``
    run against a local stand-in named in :data:`STAND_INS`: a Dask
    ``LocalCluster`` for a scheduler's address, the moto S3 server for a bucket.
    The stand-in rewrites the block's addresses and paths to its own (listed
    there) and sets the environment of a client to reach it.

``python -m tests.support.docblocks PAGE [PAGE ...] --workdir DIR`` runs pages (the
test suite: ``tests/test_project/test_docs.py``) and prints ``ok PAGE:LINE`` for every
block that ran.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON_LANGS = frozenset(["python", "py"])
SHELL_LANGS = frozenset(["bash", "sh", "shell", "console"])
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not run|run with):\s*(?P<what>.+?)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of a page."""

    page: str
    """The page, relative to the repository (``docs/caching.md``)."""
    line: int
    """Line of its opening fence (from 1)."""
    lang: str
    """Its language (the first word of the fence's info string)."""
    code: str
    """Its text, dedented to the fence."""
    not_run: str | None = None
    """Why it is not run (``<!-- not run: ... -->``), or None."""
    stand_in: str | None = None
    """The stand-in it runs with (``<!-- run with: ... -->``), or None."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the tests run it (an example, not marked as not run)."""
        return self.lang in PYTHON_LANGS | SHELL_LANGS and self.not_run is None


def pages() -> list[Path]:
    """Every page whose blocks run: the README and ``docs/*.md``."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def parse(path: Path) -> list[Block]:
    """Every fenced block of the markdown file ``path``, in order.

    Raises
    ------
    ValueError
        If a fence is not closed, or a marker is not followed by a fence.
    """
    resolved = path.resolve()
    page = (resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved).as_posix()
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    marker: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        m = _MARKER.match(lines[i])
        if m:
            marker = (m["kind"], m["what"], i + 1)
            i += 1
            continue
        f = _FENCE.match(lines[i])
        if not f:
            if lines[i].strip() and marker is not None:
                raise ValueError(f"{page}:{marker[2]}: a marker must come right before a fence")
            i += 1
            continue
        indent, fence = len(f["indent"]), f["fence"]
        lang = (f["info"].split() or [""])[0].lower()
        body: list[str] = []
        start = i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start}: the fence is not closed")
        i += 1
        kind, what = (marker[0], marker[1]) if marker else ("", "")
        blocks.append(Block(page, start, lang, "\n".join(body) + "\n",
                            not_run=what if kind == "not run" else None,
                            stand_in=what if kind == "run with" else None))
        marker = None
    return blocks


# -- what the pages read ---------------------------------------------------------------

TITLES = ("The Quiet Harbour", "A Field Guide to Clouds", "Night Trains", "Salt and Iron",
          "The Last Cartographer", "Small Hours", "River of Glass")


def make_workdir(root: Path) -> Path:
    """Write the files the examples read into ``root`` and return it.

    - ``images/``: 48 small JPEG covers (every tenth grayscale) in 7 folders;
    - ``train_ratings.csv``: 160 ratings of 36 of them (paths repeat, in no
      order): ``img_path`` (relative to ``root``), ``rating``, ``label``, ``title``;
    - ``test_ratings.csv``: 40 ratings of the other 12;
    - ``paths.txt``: every cover's path, one a line.
    """
    import numpy as np

    from tests.conftest import write_images

    root.mkdir(parents=True, exist_ok=True)
    covers = [os.path.relpath(p, root) for p in write_images(root / "images", 48, gray_every=10)]
    rng = np.random.default_rng(0)
    for name, chosen, rows in (("train_ratings.csv", covers[:36], 160),
                               ("test_ratings.csv", covers[36:], 40)):
        with open(root / name, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["img_path", "rating", "label", "title"])
            for i in rng.integers(0, len(chosen), rows):
                path = chosen[i]
                out.writerow([path, round(float(rng.uniform(1, 10)), 1),
                              covers.index(path) % 4, TITLES[covers.index(path) % len(TITLES)]])
    (root / "paths.txt").write_text("\n".join(covers) + "\n")
    return root


# -- stand-ins ---------------------------------------------------------------------------

#: The stand-ins a block may run with, and what each replaces in its text.
STAND_INS: dict[str, str] = {
    "dask": "a dask.distributed LocalCluster of 2 worker processes; 'tcp://scheduler:8786' "
            "becomes its address and '/shared/' a directory of the working directory",
    "s3": "the moto S3 server of benchmarks/common/s3server.py with the bucket 'bucket'; the "
          "AWS_* environment points clients at it, and '/local-nvme/' becomes a directory "
          "of the working directory",
}


@contextlib.contextmanager
def stand_in(name: str, workdir: Path) -> Iterator[dict[str, str]]:
    """Start the stand-in ``name``; yield the replacements it makes in a block's text."""
    if name == "dask":
        distributed: Any = importlib.import_module("distributed")  # untyped
        (workdir / "shared").mkdir(exist_ok=True)
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster:
            yield {"tcp://scheduler:8786": cluster.scheduler_address,
                   "/shared/": f"{workdir}/shared/"}
        return
    if name == "s3":
        from benchmarks.common.s3server import S3Process

        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
        try:
            server = S3Process()  # python -m benchmarks.common.s3server, from the repository
        finally:
            if path is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = path
        saved = {k: os.environ.get(k) for k in _AWS}
        try:
            server.create_bucket("bucket")
            os.environ.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="testing",
                              AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
            yield {"/local-nvme/": f"{workdir}/local-nvme/"}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            server.stop()
        return
    raise ValueError(f"no stand-in named {name!r}; there are {sorted(STAND_INS)}")


_AWS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


# -- running -----------------------------------------------------------------------------


def shell_script(block: Block) -> str:
    """The commands of a shell block (of a ``console`` block: its ``$ `` lines)."""
    if block.lang != "console":
        return block.code
    return "".join(line[2:] + "\n" for line in block.code.splitlines() if line.startswith("$ "))


def run_block(block: Block, namespace: dict[str, Any], workdir: Path) -> None:
    """Run one block in ``workdir``: Python in ``namespace``, shell with ``bash -e``."""
    with contextlib.ExitStack() as stack:
        replace = {} if block.stand_in is None else stack.enter_context(
            stand_in(block.stand_in, workdir))
        code = block.code if block.lang in PYTHON_LANGS else shell_script(block)
        for old, new in replace.items():
            if old not in code:
                raise ValueError(f"{block.where}: runs with {block.stand_in!r}, which replaces "
                                 f"{old!r}, but the block does not contain it")
            code = code.replace(old, new)
        if block.lang in PYTHON_LANGS:
            exec(compile("\n" * block.line + code, block.page, "exec"), namespace)  # lines as in the page
            return
        bin_dir = str(Path(sys.executable).parent)
        env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=240)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            raise RuntimeError(f"{block.where}: the commands exited with {proc.returncode}:\n"
                               f"{code}\n{proc.stderr}")


def run_page(path: Path, workdir: Path) -> int:
    """Run every block of ``path`` that runs, in order; return how many ran."""
    os.chdir(workdir)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    count = 0
    for block in parse(path):
        if not block.runs:
            continue
        try:
            run_block(block, namespace, workdir)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {block.where}", flush=True)
            raise
        print(f"ok {block.where}", flush=True)
        count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pages", nargs="+", type=Path)
    parser.add_argument("--workdir", type=Path, required=True,
                        help="where the examples run (made with make_workdir if missing)")
    args = parser.parse_args(argv)
    if not (args.workdir / "train_ratings.csv").exists():
        make_workdir(args.workdir)
    workdir = args.workdir.resolve()
    for page in args.pages:
        run_page(page.resolve(), workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
