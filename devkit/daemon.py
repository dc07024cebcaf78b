"""The one daemon wrapper: ``python -m tesla_gateway run --config X`` as a child process, observed
through its status.json and /proc, for the tests, the demo and the bench."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from devkit.errors import DaemonExitedError, DaemonTimeoutError
from devkit.lifecycle import StartStop

__all__ = ["GatewayDaemon", "Status"]

Status = dict[str, Any]
_POLL_S = 0.02
_STOP_TIMEOUT_S = 30.0


class GatewayDaemon(StartStop):
    """The production daemon as a child process; ``start()`` spawns it, ``with`` also stops it.

    ``wrapper`` is an argv put before the interpreter (e.g. ``prlimit --fsize=N --``, which execs
    the daemon in place with the same pid); ``cpu`` pins the daemon to one CPU (the bench);
    ``new_session`` keeps a terminal's Ctrl-C away from it (the demo stops it in order); ``env``
    adds to the inherited environment; ``program`` replaces ``python -m tesla_gateway`` (e.g. an
    installed venv's ``tesla-gateway`` script).
    """

    def __init__(
        self,
        config: Path,
        state_dir: Path,
        *,
        log: Path | None = None,
        wrapper: Sequence[str] = (),
        cpu: int | None = None,
        new_session: bool = False,
        env: Mapping[str, str] | None = None,
        program: Sequence[str] = (sys.executable, "-m", "tesla_gateway"),
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self.log = log if log is not None else config.with_suffix(".log")
        self._wrapper = tuple(wrapper)
        self._cpu = cpu
        self._new_session = new_session
        self._program = tuple(program)
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0  # time.monotonic() at spawn
        self.exit_code: int | None = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise DaemonExitedError("the gateway daemon was not started")
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        if self.running:
            return self
        with self.log.open("ab") as log:
            self.spawned_at = time.monotonic()
            self._process = subprocess.Popen(  # noqa: S603  # our own module, no shell
                [
                    *self._wrapper,
                    *self._program,
                    "run",
                    "--config",
                    str(self.config),
                ],
                stdout=log,
                stderr=log,
                env=self._env,
                start_new_session=self._new_session,
            )
        if self._cpu is not None:
            os.sched_setaffinity(self._process.pid, {self._cpu})
        return self

    def check_alive(self) -> None:
        """Raise with the end of the daemon's log if it has exited."""
        process = self.process
        if process.poll() is not None:
            self.exit_code = process.returncode
            raise DaemonExitedError(
                f"the gateway daemon exited with code {self.exit_code}; end of its log "
                f"({self.log}):\n{self.log_tail()}"
            )

    def status(self) -> Status:
        """The daemon's status.json ({} until it first writes it); raises if the daemon exited."""
        self.check_alive()
        try:
            document = json.loads((self.state_dir / "status.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return document if isinstance(document, dict) else {}

    def ready(self, *, wait_sources: bool = True) -> bool:
        """This process runs (status.json carries its pid) and, with ``wait_sources``, every MQTT
        source is subscribed (readings sent earlier would be lost)."""
        return _ready(self.status(), self.pid, wait_sources=wait_sources)

    def wait_ready(
        self, timeout_s: float = 60.0, *, wait_sources: bool = True, poll_s: float = _POLL_S
    ) -> float:
        """Poll until :meth:`ready`; returns the seconds from spawn to phase ``running`` (as
        precise as ``poll_s``)."""
        running_at: float | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if running_at is None and _ready(status, self.pid, wait_sources=False):
                running_at = time.monotonic()
            if running_at is not None and _ready(status, self.pid, wait_sources=wait_sources):
                return running_at - self.spawned_at
            if time.monotonic() > deadline:
                raise DaemonTimeoutError(
                    f"the gateway daemon did not become ready within {timeout_s:.0f} s; end of "
                    f"its log ({self.log}):\n{self.log_tail()}"
                )
            time.sleep(poll_s)

    def wait_status(self, predicate: Callable[[Status], bool], timeout_s: float = 30.0) -> Status:
        """The first non-empty status satisfying ``predicate``, or the last one after the time."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status and predicate(status):
                return status
            if time.monotonic() > deadline:
                return status
            time.sleep(_POLL_S)

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (the daemon's clean shutdown path), then SIGKILL if it hangs; the exit code."""
        process = self._process
        if process is None:
            return self.exit_code
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.exit_code = process.returncode
        return self.exit_code

    def kill(self) -> None:
        """SIGKILL (a power cut, as far as the daemon can tell) and reap."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        self.exit_code = process.returncode

    def proc_status_kib(self, key: str) -> int:
        """A /proc/<pid>/status field in KiB (VmRSS, VmHWM); 0 if absent."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def cpu_s(self) -> float:
        """utime + stime of every thread of the daemon so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def open_fds(self) -> int:
        return sum(1 for _ in Path(f"/proc/{self.pid}/fd").iterdir())

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"


def _ready(status: Status, pid: int, *, wait_sources: bool) -> bool:
    if status.get("pid") != pid or status.get("phase") != "running":
        return False
    connected = status.get("mqtt_sources_connected")
    return not wait_sources or (isinstance(connected, dict) and all(connected.values()))
