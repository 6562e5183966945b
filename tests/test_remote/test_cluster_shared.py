"""``remote=`` with a node cache shared by a group (``share_with=``): real users, switched in
forked children (:mod:`tests.support._uids`), on one node cache and a shared directory."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc

from ..support import _uids
from ..support._cache_loaders import LogLoader, expected, log_lines, write_sources
from ..support._uids import Accounts, run_as

pytestmark = pytest.mark.skipif(not _uids.can_switch_users(), reason="needs root")


@pytest.fixture(scope="module", autouse=True)
def _preloaded() -> None:
    # the children cannot read the interpreter's files (root's home): import everything now
    _uids.preload("tensorstore_cache", skip=("torch",))


def get(cache: str, keys: list[str], log: str, group: str, remote: str) -> Any:
    with tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), workers=1, progress=False,
                    share_with=group, remote=remote) as store:
        return np.array(store.take(store.rows(keys)))


def test_members_share_a_node_cache_of_a_remote(base: Path, accounts: Accounts) -> None:
    """Two members of a group use one node cache (``share_with=``) of a shared-directory
    remote: the second gets the first's vectors without computing them, then builds new keys
    through the remote itself (the store probe included), and the node cache's directories
    are the group's (setgid, group-writable)."""
    group, gid = accounts.group()
    a, b = accounts.user(groups=(group,)), accounts.user(groups=(group,))
    keys = write_sources(base / "src", 12)
    os.chmod(base / "src", 0o755)
    log = base / "log"
    log.touch()
    os.chmod(log, 0o666)
    remote, team = base / "remote", base / "team"
    remote.mkdir()
    os.chown(remote, 0, gid)
    os.chmod(remote, 0o2770)
    got = run_as(a, get, str(team), keys[:8], str(log), group, str(remote), umask=0o002)
    np.testing.assert_array_equal(got, expected(keys[:8]))
    got = run_as(b, get, str(team), keys, str(log), group, str(remote), umask=0o002)
    np.testing.assert_array_equal(got, expected(keys))
    calls = [key for _pid, key in log_lines(log)]
    assert sorted(calls) == sorted(keys)  # each key once: b built only the 4 new ones
    probes = team / "remote" / "probes"
    assert probes.is_dir() and grp.getgrgid(probes.stat().st_gid).gr_name == group
    assert stat.S_IMODE(probes.stat().st_mode) & 0o2070 == 0o2070
