"""MkDocs hooks: the README as the site's front page, and links to the repository's files.

The pages are written to read well on GitHub too, so they link files of the
repository by relative path (``../benchmarks/results/run/time_to_vectors.png``,
``../tests/data/format_v1/``). The site cannot serve those paths, so:

- the front page ``index.md`` is generated from ``README.md``, its links to
  ``docs/X.md`` made links to ``X.md`` and its other relative links made links
  from ``docs/`` (``../benchmarks/...``);
- a link to an image of the repository is served from the site's
  ``_repo/`` copy of it; a link to any other file or directory of the
  repository becomes its path in code (the site does not host the sources);
- a link to a path that does not exist is a warning, which ``mkdocs build
  --strict`` turns into a failure, as MkDocs does for links between pages.

Links inside code blocks and code spans are left alone.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.plugins.repo_links")

_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif")
_SERVED = "_repo"


def _repo(config: Any) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def _outside_code(markdown: str, rewrite: Any) -> str:
    """Apply ``rewrite`` (a link's match -> its new text) to every link outside code.

    Links in fenced blocks are left alone, and so are those inside code spans;
    a link whose text is a code span is a link.
    """
    out: list[str] = []
    fenced = False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        if fenced or _FENCE.match(line):
            out.append(line)
            continue
        masked = re.sub(r"`[^`\n]*`", lambda m: "`" + "\0" * (len(m[0]) - 2) + "`", line)
        pieces, last = [], 0
        for m in _LINK.finditer(masked):
            real = _LINK.fullmatch(line, m.start(), m.end())
            assert real is not None
            pieces.append(line[last:m.start()])
            pieces.append(rewrite(real))
            last = m.end()
        pieces.append(line[last:])
        out.append("".join(pieces))
    return "".join(out)


def _readme_as_index(markdown: str) -> str:
    def one(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"[a-z]+:|#|/", target):
            return m[0]
        target = target[len("docs/"):] if target.startswith("docs/") else "../" + target
        return f"{m['bang']}[{m['text']}]({target})"

    return _outside_code(markdown, one)


def _repo_targets(markdown: str) -> list[str]:
    found: list[str] = []

    def collect(m: re.Match[str]) -> str:
        found.append(m["target"])
        return m[0]

    _outside_code(markdown, collect)
    return [t for t in found if t.startswith("../")]


def on_files(files: Files, config: Any) -> Files:
    """Add the front page (from the README) and the repository's images that pages show."""
    repo = _repo(config)
    readme = (repo / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=_readme_as_index(readme)))
    served: set[str] = set()
    for page in [f for f in files if f.src_uri.endswith(".md")]:
        text = page.content_string
        for target in _repo_targets(text):
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri),
                                                    target.split("#")[0]))
            if not rel.startswith("../"):
                continue  # a page of the site
            rel = rel[3:]
            if rel.lower().endswith(_IMAGES) and (repo / rel).is_file() and rel not in served:
                served.add(rel)
                files.append(File.generated(config, f"{_SERVED}/{rel}",
                                            abs_src_path=str(repo / rel)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links to the repository's files at what the site has of them."""
    repo = _repo(config)
    here = posixpath.dirname(page.file.src_uri)

    def one(m: re.Match[str]) -> str:
        target = m["target"]
        if not target.startswith("../"):
            return m[0]
        path = target.partition("#")[0]
        rel = posixpath.normpath(posixpath.join(here, path))
        if not rel.startswith("../"):
            return m[0]  # a page of the site: MkDocs checks it
        rel = rel[3:]
        if not (repo / rel).exists():
            log.warning("Doc file '%s' contains a link to '%s', which is not a file of the "
                        "repository", page.file.src_uri, target)
            return m[0]
        if rel.lower().endswith(_IMAGES):
            served = posixpath.relpath(f"{_SERVED}/{rel}", here or ".")
            return f"{m['bang']}[{m['text']}]({served})"
        shown = rel + ("/" if (repo / rel).is_dir() and not rel.endswith("/") else "")
        if m["text"].strip("`") in (rel, shown, rel.rstrip("/")):
            return f"`{shown}`"
        return f"{m['text']} (`{shown}`)"

    return _outside_code(markdown, one)
