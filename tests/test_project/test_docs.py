"""The documentation: every example of the README and of ``docs/`` runs, the site builds strictly.

* Each page's code blocks run in a fresh process, as ``tests/support/docblocks.py``
  describes (in order, Python blocks sharing a namespace, shell blocks with
  ``bash -e``), in a working directory holding what the pages read; blocks
  marked ``not run`` are listed with their reason, and blocks marked ``run
  with`` run against a local Dask cluster or S3 server.
* ``mkdocs build --strict`` builds the site (a broken link or anchor, a page
  missing from the nav, a docstring the reference cannot render fail it), and
  the reference shows every public name with its signature.
* The README is the front page: short, and linking every page.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tensorstore_cache
import tensorstore_cache.torch as tsc_torch

from ..support.docblocks import PYTHON_LANGS, REPO, SHELL_LANGS, STAND_INS, Block, pages, parse

PAGES = pages()
BLOCKS = [b for page in PAGES for b in parse(page)]
TIMEOUT_S = 600  # a guard against hangs, not a timing assertion
_ENV = {"NO_MKDOCS_2_WARNING": "1"}


def _page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def test_every_block_has_a_language_and_a_valid_mark() -> None:
    assert len(PAGES) >= 18 and BLOCKS
    unlabelled = [b.where for b in BLOCKS if not b.lang]
    assert not unlabelled, f"label these fences (python, bash, text, ...): {unlabelled}"
    for b in BLOCKS:
        if b.not_run is not None or b.stand_in is not None:
            assert b.lang in PYTHON_LANGS | SHELL_LANGS, f"{b.where}: only examples are marked"
        if b.not_run is not None:
            assert len(b.not_run) > 10, f"{b.where}: say why it does not run"
        if b.stand_in is not None:
            assert b.stand_in in STAND_INS, f"{b.where}: no stand-in named {b.stand_in!r}"


def test_the_blocks_that_do_not_run_are_few_and_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    examples = [b for b in BLOCKS if b.lang in PYTHON_LANGS | SHELL_LANGS]
    skipped = [b for b in examples if not b.runs]
    with capsys.disabled():
        print(f"\n{len(examples) - len(skipped)} of {len(examples)} examples run "
              f"({sum(b.stand_in is not None for b in examples)} with a stand-in); not run:")
        for b in skipped:
            print(f"  {b.where}: {b.not_run}")
    python_skipped = [b for b in skipped if b.lang in PYTHON_LANGS]
    assert len(python_skipped) <= 2, [b.where for b in python_skipped]
    assert len(skipped) * 3 < len(examples)


def test_a_marker_must_stand_right_before_a_fence(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text("<!-- not run: a reason long enough -->\n\ntext\n```python\n1\n```\n")
    with pytest.raises(ValueError, match="right before a fence"):
        parse(page)
    page.write_text("<!-- not run: a reason long enough -->\n```python\n1\n```\n```py\n2\n```\n")
    assert [(b.not_run, b.runs) for b in parse(page)] == [("a reason long enough", False),
                                                           (None, True)]


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.runs for b in parse(p))], ids=_page_id)
def test_the_examples_of_a_page_run(page: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("pandas")
    env = {**os.environ, "TSC_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TSC_CACHE_GROUP", None)
    env.pop("TSC_CACHE_MAX_BYTES", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.docblocks", str(page), "--workdir", str(tmp_path / "work")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    ran = re.findall(r"^ok (\S+)$", proc.stdout, re.M)
    assert ran == [b.where for b in parse(page) if b.runs], proc.stdout[-3000:]


def _build_site(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent, env={**os.environ, **_ENV}, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )


def test_the_site_builds_strictly_and_the_reference_shows_every_public_name(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mkdocs")
    proc = _build_site(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(["index.md", *(p.name for p in PAGES[1:])])
    for name in nav:
        built = site / ("index.html" if name == "index.md" else f"{name[:-3]}/index.html")
        assert built.is_file(), name
    front = (site / "index.html").read_text()
    assert "Preprocess once, map everywhere" in front  # the README is the front page
    assert "_repo/benchmarks/results/sweep/sweep_timeline.png" in front
    assert (site / "_repo/benchmarks/results/sweep/sweep_timeline.png").is_file()
    reference = (site / "api" / "index.html").read_text()
    for module in (tensorstore_cache, tsc_torch):
        for name in module.__all__:
            anchor = f'id="{module.__name__}.{name}"'
            assert anchor in reference, f"the API reference lacks {module.__name__}.{name}"
    # signatures with their types
    assert re.search(r"lock_timeout</span>.*?float", reference, re.S), "no typed signature"


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    copy = tmp_path / "repo"  # the repository, its docs/ a copy that can be broken
    copy.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("docs", "site", ".git"):
            (copy / entry.name).symlink_to(entry)
    shutil.copytree(REPO / "docs", copy / "docs")
    assert _build_site(copy / "mkdocs.yml", tmp_path / "ok").returncode == 0
    page = copy / "docs" / "pandas.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    proc = _build_site(copy / "mkdocs.yml", tmp_path / "broken")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stdout + proc.stderr


def test_the_readme_is_a_short_front_page_linking_every_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = set(re.findall(r"\]\((docs/[a-z-]+\.md)(?:#[^)]*)?\)", readme))
    assert links == {f"docs/{p.name}" for p in PAGES[1:]}, sorted(links)
    for target in re.findall(r"\]\(([^)#\s]+)", readme):
        if not re.match(r"[a-z]+:", target):
            assert (REPO / target).exists(), f"README links to a missing {target}"


def _blocks(page: str) -> list[Block]:
    return [b for b in BLOCKS if b.page == page]


def test_the_readme_getting_started_is_about_fifteen_lines() -> None:
    section = (REPO / "README.md").read_text().split("## Getting started", 1)[1].split("\n## ")[0]
    [block] = [b for b in _blocks("README.md") if f"```python\n{b.code}" in section]
    assert block.runs and len(block.code.splitlines()) <= 16
