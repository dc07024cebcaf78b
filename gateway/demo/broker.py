"""A private mosquitto for the demo: a free loopback port, its own config, stopped at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from gateway.demo import DemoError

__all__ = ["MOSQUITTO", "PrivateBroker", "free_port"]

MOSQUITTO = Path("/usr/sbin/mosquitto")
_START_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateBroker:
    """One mosquitto process listening on 127.0.0.1 only; ``with`` starts and stops it."""

    def __init__(self, work_dir: Path, executable: Path = MOSQUITTO) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self._executable = executable
        self._work_dir = work_dir
        self.log_path = work_dir / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if not os.access(self._executable, os.X_OK):
            raise DemoError(
                f"mosquitto is not installed ({self._executable} not found); run `make setup`"
            )
        self._work_dir.mkdir(parents=True, exist_ok=True)
        config = self._work_dir / "mosquitto.conf"
        config.write_text(
            "\n".join(
                [
                    f"listener {self.port} 127.0.0.1",
                    # As root mosquitto would switch to user 'mosquitto', who cannot read our
                    # private temporary directory.
                    *(["user root"] if os.geteuid() == 0 else []),
                    "allow_anonymous true",
                    "persistence false",
                    "log_dest stderr",
                    "log_type error",
                    "log_type warning",
                    "max_queued_messages 100000",
                    # mosquitto's default of 20 is also the Receive Maximum it announces to
                    # MQTT 5 clients, which caps the gateway's QoS 1 publishes in flight; with
                    # 20, 10,000 per-sensor messages a second queued for 0.6 s (make bench).
                    "max_inflight_messages 1000",
                    # Without it Nagle's algorithm delays every PUBACK by about 40 ms.
                    "set_tcp_nodelay true",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603  # fixed argv, no shell
                [str(self._executable), "-c", str(config)],
                stdout=log,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops us in order
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                text = self.log_path.read_text(errors="replace").strip()
                self._process = None
                raise DemoError(f"mosquitto exited at start: {text or 'no output'}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise DemoError(f"mosquitto did not listen on port {self.port} within {_START_TIMEOUT_S} s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
