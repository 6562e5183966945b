"""What a remote prefix shared by ``cached(remote=...)`` holds, and its explicit collection.

:func:`survey` lists every namespace under the prefix (one listing of the
prefix, then its current manifest and lease): its generation, the parts the
current generation names, the objects and bytes, and the current lease's
holder and age. :func:`collect_remote` deletes, only when called, what no
reader needs any more:

* a part (every object of it) that the current generation does not name,
  once it has been out of use for ``older_than``: since the first
  generation that stopped naming it was committed, or, for a part no
  generation ever named (a holder that lost its commit or died before it),
  since it was uploaded;
* leases of generations before the current one, and store probes, older than
  ``older_than``.

Never a manifest (readers walk them to find the current generation, and a
deleted name could be created again), never ``head.json``, never a part the
current generation names. Ages compare the store's timestamps with this
machine's clock: keep ``older_than`` well above any clock error and above
the time a node may keep reading an old generation (a lease time at least).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ..fs import age_text
from .manifests import RemoteNamespace
from .node_cache import Removed
from .objects import ObjectInfo, Objects

__all__ = ["RemoteCacheInfo", "collect_remote", "survey_prefix"]

_Kind = Literal["remote-part", "remote-lease", "remote-probe"]

_MANIFEST = re.compile(r"manifests/(\d{8,})\.json")
_LEASE = re.compile(r"leases/g(\d{8,})\.a(\d{4,})\.json")
_PROBES = ".tsc-probe/"


@dataclass(frozen=True, slots=True)
class RemoteCacheInfo:
    """One namespace under a remote prefix, as listed by
    :func:`~tensorstore_cache.list_caches` with ``remote=``."""

    namespace: str
    """Its name: the same as the namespace directory's in a cache directory."""
    url: str
    """Its prefix (credentials redacted)."""
    generation: int
    """The current generation (the highest manifest; 0: nothing committed)."""
    generations: int
    """Manifests kept (one per commit)."""
    parts: int
    """Parts the current generation names."""
    objects: int
    """Objects under the namespace's prefix, superseded parts included."""
    bytes: int
    """Their bytes."""
    lease: str | None
    """The newest lease on the current generation: ``"held by host (pid 42)"`` or
    ``"released by host (pid 42)"``; None if there is none."""
    lease_age: float | None
    """Seconds since that lease was last written (a heartbeat, or its release), by the
    store's clock against this machine's."""


@dataclass
class _Namespace:
    """The objects of one namespace, by kind."""

    name: str
    manifests: dict[int, ObjectInfo] = field(default_factory=dict)
    leases: dict[tuple[int, int], ObjectInfo] = field(default_factory=dict)
    parts: dict[str, list[ObjectInfo]] = field(default_factory=lambda: defaultdict(list))
    other: list[ObjectInfo] = field(default_factory=list)

    @property
    def generation(self) -> int:
        return max(self.manifests, default=0)

    def all(self) -> list[ObjectInfo]:
        return [*self.manifests.values(), *self.leases.values(),
                *(o for objs in self.parts.values() for o in objs), *self.other]


def _sorted(listing: Iterable[ObjectInfo]) -> tuple[dict[str, _Namespace], list[ObjectInfo]]:
    """The namespaces of a prefix's listing, and its probes."""
    spaces: dict[str, _Namespace] = {}
    probes = []
    for info in listing:
        if info.rel.startswith(_PROBES):
            probes.append(info)
            continue
        name, _, rest = info.rel.partition("/")
        if not rest:
            continue
        ns = spaces.setdefault(name, _Namespace(name))
        if (m := _MANIFEST.fullmatch(rest)) is not None:
            ns.manifests[int(m.group(1))] = info
        elif (m := _LEASE.fullmatch(rest)) is not None:
            ns.leases[(int(m.group(1)), int(m.group(2)))] = info
        elif rest.startswith("parts/"):
            ns.parts[rest.removeprefix("parts/").split("/", 1)[0].split(".", 1)[0]].append(info)
        else:
            ns.other.append(info)
    return {k: v for k, v in spaces.items() if v.manifests or v.parts}, probes


def survey_prefix(objects: Objects) -> list[RemoteCacheInfo]:
    """Every namespace under ``objects``'s prefix, by name.

    One listing of the prefix, then for each namespace its current manifest
    and newest lease (two reads).
    """
    spaces, _probes = _sorted(objects.listing(""))
    now = time.time()
    out = []
    for ns in sorted(spaces.values(), key=lambda n: n.name):
        gen = ns.generation
        manifest = RemoteNamespace(objects, ns.name).read_manifest(gen) if gen else None
        lease, age = _lease(objects, ns, now)
        every = ns.all()
        out.append(RemoteCacheInfo(
            namespace=ns.name, url=objects.where(ns.name), generation=gen,
            generations=len(ns.manifests), parts=len(manifest.parts) if manifest else 0,
            objects=len(every), bytes=sum(o.size for o in every), lease=lease, lease_age=age))
    return out


def _lease(objects: Objects, ns: _Namespace, now: float) -> tuple[str | None, float | None]:
    current = [k for k in ns.leases if k[0] == ns.generation]
    if not current:
        return None, None
    newest = max(current)
    doc = objects.read_json(ns.leases[newest].rel)
    if doc is None:
        return None, None
    state = "released" if doc.get("state") == "released" else "held"
    return (f"{state} by {doc.get('host', '?')} (pid {doc.get('pid', '?')})",
            max(0.0, now - ns.leases[newest].modified))


def collect_remote(
    objects: Objects, older_than: float, *, dry_run: bool = False, now: float | None = None
) -> list[Removed]:
    """Delete what no reader of the prefix needs and has been out of use for ``older_than``
    seconds (see the module's description); return what went (or would, ``dry_run``).

    Raises
    ------
    ValueError
        If ``older_than`` is negative.
    WriteDeniedError
        If the credentials may not delete.
    """
    if older_than < 0:
        raise ValueError(f"older_than must not be negative, got {older_than!r}")
    now = time.time() if now is None else now
    spaces, probes = _sorted(objects.listing(""))
    out: list[Removed] = []

    def drop(infos: list[ObjectInfo], kind: _Kind, reason: str) -> None:
        if not dry_run:
            for info in infos:
                objects.delete(info.rel)
        out.append(Removed(objects.where(_common(infos)), kind, sum(i.size for i in infos),
                           reason))

    for ns in sorted(spaces.values(), key=lambda n: n.name):
        for _part, infos, since, why in _idle_parts(objects, ns):
            if now - since >= older_than:
                drop(infos, "remote-part", f"{why} {age_text(now - since)} ago")
        for (gen, _attempt), info in sorted(ns.leases.items()):
            if gen < ns.generation and now - info.modified >= older_than:
                drop([info], "remote-lease", f"a lease on generation {gen}, superseded")
    for info in probes:
        if now - info.modified >= older_than:
            drop([info], "remote-probe", f"a store probe of {age_text(now - info.modified)} ago")
    return out


def _idle_parts(
    objects: Objects, ns: _Namespace
) -> list[tuple[str, list[ObjectInfo], float, str]]:
    """The parts the current generation does not name: ``(id, objects, out of use since,
    why)``."""
    rns = RemoteNamespace(objects, ns.name)
    last: dict[str, int] = {}
    current: set[str] = set()
    for gen in sorted(ns.manifests):
        manifest = rns.read_manifest(gen)
        if manifest is None:
            continue
        named = {p.id for p in manifest.parts}
        last.update(dict.fromkeys(named, gen))
        if gen == ns.generation:
            current = named
    out = []
    for part, infos in sorted(ns.parts.items()):
        if part in current:
            continue
        if part in last:
            after = [g for g in ns.manifests if g > last[part]]
            since = ns.manifests[min(after)].modified if after else _newest(infos)
            out.append((part, infos, since, "superseded by a later generation"))
        else:
            out.append((part, infos, _newest(infos), "never committed, uploaded"))
    return out


def _newest(infos: list[ObjectInfo]) -> float:
    """When the newest of ``infos`` was written."""
    return max(i.modified for i in infos)


def _common(infos: list[ObjectInfo]) -> str:
    if len(infos) == 1:
        return infos[0].rel
    first = infos[0].rel.split("/")
    return "/".join(first[:3]) if first[1:2] == ["parts"] else infos[0].rel

