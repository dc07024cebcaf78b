"""The one mosquitto launcher: a real broker on a free loopback port for the tests, the demo and
the bench.

By default the broker keeps persistence on (so persistent sessions and retained messages survive
a ``restart()``) and can be stopped and started again on the same port to simulate an outage.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devkit.errors import BrokerError
from devkit.lifecycle import StartStop

MOSQUITTO = Path("/usr/sbin/mosquitto")
MOSQUITTO_PASSWD = Path("/usr/bin/mosquitto_passwd")
_STOP_TIMEOUT_S = 10.0

__all__ = [
    "MOSQUITTO",
    "Mosquitto",
    "TestPki",
    "free_port",
    "free_ports",
    "make_test_pki",
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
        subprocess.run(  # noqa: S603  # fixed argv, no shell
            ["openssl", *args],  # noqa: S607  # openssl from PATH, as an operator would run it
            check=True,
            capture_output=True,
            cwd=directory,
        )

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


class Mosquitto(StartStop):
    """One broker process; ``stop()`` / ``start()`` keep the port, data directory and config.

    ``persistence=False`` with ``max_inflight_messages=1000`` is the demo's and the bench's
    broker; ``new_session=True`` keeps a terminal's Ctrl-C away from it (its owner stops it in
    order). ``with`` starts and stops it.
    """

    def __init__(
        self,
        work_dir: Path,
        port: int | None = None,
        users: dict[str, str] | None = None,
        tls: TestPki | None = None,
        acl: str | None = None,
        *,
        executable: Path = MOSQUITTO,
        persistence: bool = True,
        max_queued_messages: int = 100_000,
        max_inflight_messages: int | None = None,
        sys_interval_s: int = 10,
        new_session: bool = False,
    ) -> None:
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port()
        self.work_dir = work_dir
        self.executable = executable
        self.config_path = work_dir / "mosquitto.conf"
        self.log_path = work_dir / "mosquitto.log"
        self._new_session = new_session
        self._process: subprocess.Popen[bytes] | None = None
        self._check_installed()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        auth = ["allow_anonymous true"]
        if users:
            auth = ["allow_anonymous false", f"password_file {self._password_file(users)}"]
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
        storage = (
            ["persistence true", f"persistence_location {work_dir}/", "autosave_interval 1"]
            if persistence
            else ["persistence false"]
        )
        # mosquitto's default of 20 is also the Receive Maximum it announces to MQTT 5 clients,
        # which caps the gateway's QoS 1 publishes in flight; with 20, 10,000 per-sensor
        # messages a second queued for 0.6 s (make bench).
        inflight = (
            [f"max_inflight_messages {max_inflight_messages}"]
            if max_inflight_messages is not None
            else []
        )
        self.config_path.write_text(
            "\n".join(
                [
                    f"listener {self.port} 127.0.0.1",
                    # As root mosquitto would switch to user 'mosquitto', which cannot read the
                    # private temporary directory; stay the invoking user instead.
                    *(["user root"] if os.geteuid() == 0 else []),
                    *auth,
                    *storage,
                    "log_dest stderr",
                    "log_type error",
                    "log_type warning",
                    # Per client; beyond it mosquitto drops messages for that client ("outgoing
                    # messages are being dropped"): small in the tests that make it lose some.
                    f"max_queued_messages {max_queued_messages}",
                    *inflight,
                    # Without it Nagle delays PUBACKs by ~40 ms and throughput drops 8x.
                    "set_tcp_nodelay true",
                    f"sys_interval {sys_interval_s}",  # how often $SYS/# is updated
                    "",
                ]
            ),
            encoding="utf-8",
        )

    def _check_installed(self) -> None:
        if not os.access(self.executable, os.X_OK):
            raise BrokerError(
                f"mosquitto is not installed ({self.executable} not found); run `make setup`"
            )

    def _password_file(self, users: dict[str, str]) -> Path:
        password_file = self.work_dir / "passwords"
        password_file.write_text("", encoding="utf-8")
        for user, password in users.items():
            subprocess.run(  # noqa: S603  # fixed argv, no shell
                [str(MOSQUITTO_PASSWD), "-b", str(password_file), user, password],
                check=True,
                capture_output=True,
            )
        return password_file

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the broker and wait until it accepts connections."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603  # fixed argv, no shell
                [str(self.executable), "-c", str(self.config_path)],
                stdout=log,
                stderr=log,
                start_new_session=self._new_session,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                text = self.log_path.read_text(errors="replace").strip()
                raise BrokerError(f"mosquitto exited at start: {text or 'no output'}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise BrokerError(f"mosquitto did not listen on port {self.port} within {timeout_s} s")

    def stop(self) -> None:
        """Stop the broker gracefully (it saves its persistence database on SIGTERM)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
