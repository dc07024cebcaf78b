"""A real mosquitto broker on a free loopback port, for tests and the demo.

The broker keeps persistence on (so persistent sessions and retained messages survive a
``restart()``) and can be stopped and started again on the same port to simulate an outage.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MOSQUITTO = Path("/usr/sbin/mosquitto")
MOSQUITTO_PASSWD = Path("/usr/bin/mosquitto_passwd")

__all__ = [
    "MOSQUITTO",
    "Mosquitto",
    "TestPki",
    "free_port",
    "free_ports",
    "make_test_pki",
    "mosquitto",
]


@dataclass(frozen=True)
class TestPki:
    """A throw-away CA with a server certificate for 127.0.0.1 and a client certificate."""

    __test__ = False  # not a pytest test class despite the name

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_test_pki(directory: Path) -> TestPki:
    """Generate the PKI with the openssl CLI (EC keys: fast)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=tesla-test-ca",
    )
    extensions = {
        "server": ("/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        "client": ("/CN=gateway", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, extension) in extensions.items():
        (directory / f"{name}.ext").write_text(extension, encoding="utf-8")
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    return TestPki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 (all held while picking, so no repeats)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Mosquitto:
    """One broker process; ``stop()`` / ``start()`` keep the port, data directory and config."""

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        users: dict[str, str] | None = None,
        tls: TestPki | None = None,
        acl: str | None = None,
        *,
        max_queued_messages: int = 100_000,
        sys_interval_s: int = 10,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port()
        self.work_dir = work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = work_dir / "mosquitto.conf"
        self.log_path = work_dir / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None
        auth = ["allow_anonymous true"]
        if users:
            password_file = work_dir / "passwords"
            password_file.write_text("", encoding="utf-8")
            for user, password in users.items():
                subprocess.run(
                    [str(MOSQUITTO_PASSWD), "-b", str(password_file), user, password],
                    check=True,
                    capture_output=True,
                )
            auth = ["allow_anonymous false", f"password_file {password_file}"]
        if acl is not None:  # mosquitto acl_file syntax; lines before any 'user' are anonymous
            acl_file = work_dir / "acl"
            acl_file.write_text(acl, encoding="utf-8")
            auth.append(f"acl_file {acl_file}")
        if tls is not None:  # TLS with client certificates required
            auth += [
                f"cafile {tls.ca}",
                f"certfile {tls.server_cert}",
                f"keyfile {tls.server_key}",
                "require_certificate true",
            ]
        self.config_path.write_text(
            "\n".join(
                [
                    f"listener {self.port} 127.0.0.1",
                    # As root mosquitto would switch to user 'mosquitto', which cannot read the
                    # test's private temporary directory; stay the invoking user instead.
                    *(["user root"] if os.geteuid() == 0 else []),
                    *auth,
                    "persistence true",
                    f"persistence_location {work_dir}/",
                    "autosave_interval 1",
                    "log_dest stderr",
                    "log_type error",
                    "log_type warning",
                    # Per client; beyond it mosquitto drops messages for that client ("outgoing
                    # messages are being dropped"): small in the tests that make it lose some.
                    f"max_queued_messages {max_queued_messages}",
                    # Without it Nagle delays PUBACKs by ~40 ms and throughput drops 8x.
                    "set_tcp_nodelay true",
                    f"sys_interval {sys_interval_s}",  # how often $SYS/# is updated
                    "",
                ]
            ),
            encoding="utf-8",
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the broker and wait until it accepts connections."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [str(MOSQUITTO), "-c", str(self.config_path)],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.log_path.read_text(errors='replace')}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout_s} s")

    def stop(self) -> None:
        """Stop the broker gracefully (it saves its persistence database on SIGTERM)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A fresh broker per test, stopped afterwards whatever happens."""
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
