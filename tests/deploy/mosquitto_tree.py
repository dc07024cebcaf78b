"""A real mosquitto on the /etc/mosquitto tree of a throwaway root, files kept apart.

mosquitto reads a copy of the root's etc/mosquitto in which every /etc/mosquitto path points into
the copy, every listener listens on 127.0.0.1 (or ::1, as configured) at a free port (``Ports``
maps each configured port to one, picked for each run: a port held over from an earlier run
may be another test's by now), and pid file,
persistence and log file are left out; as root it keeps its user ('mosquitto' does not exist
here). The files stay separate because a listener setting belongs to the listener context of its
own file: merged into one, they would mean something else. A configuration without any listener
starts in mosquitto's local only mode, on the port given with -p instead of 1883.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from devkit.broker import MOSQUITTO, free_ports
from tests.deploy.mqtt_client import WAIT_S

LEFT_OUT = re.compile(r"^(pid_file|persistence|persistence_location|log_dest)\b.*$", re.M)
LISTENER = re.compile(r"^listener (\d+)( [^#\s]+)?\s*$", re.M)


class Ports(dict[int, int]):
    """Configured port -> free loopback port, picked the first time a port is seen."""

    def __missing__(self, port: int) -> int:
        taken = set(self.values())
        while True:
            (free,) = free_ports(1)
            if free not in taken:
                self[port] = free
                return free


def _rewrite(text: str, copy: Path, ports: Ports) -> str:
    text = LEFT_OUT.sub("", text).replace("/etc/mosquitto/", f"{copy}/")
    text = text.replace("include_dir /etc/mosquitto/conf.d", f"include_dir {copy}/conf.d")

    def listener(match: re.Match[str]) -> str:
        host = (match[2] or "").strip()
        return f"listener {ports[int(match[1])]} {'::1' if host == '::1' else '127.0.0.1'}"

    return LISTENER.sub(listener, text)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def running(root: Path, work: Path) -> Iterator[Ports]:
    """mosquitto on ``root``'s configuration until the block ends; its log is work/log."""
    ports = Ports()
    copy = work / "mosquitto"
    shutil.copytree(root / "etc/mosquitto", copy)
    configs = [copy / "mosquitto.conf", *(copy / "conf.d").glob("*.conf")]
    for path in configs:
        path.write_text(_rewrite(path.read_text(encoding="utf-8"), copy, ports), encoding="utf-8")
    main = copy / "mosquitto.conf"
    prefix = "user root\n" if os.geteuid() == 0 else ""
    main.write_text(prefix + main.read_text(encoding="utf-8") + "\nlog_dest stderr\n")
    text = "\n".join(path.read_text(encoding="utf-8") for path in configs)
    configured = [int(p) for p in re.findall(r"^listener (\d+) 127\.0\.0\.1$", text, re.M)]
    command = [str(MOSQUITTO), "-c", str(main)]
    if not re.search(r"^listener ", text, re.M):  # local only mode
        command += ["-p", str(ports[1883])]
        configured = [ports[1883]]
    log = work / "log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(_listening(port) for port in configured):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "mosquitto did not start: " + log.read_text()
            time.sleep(0.05)
        assert process.poll() is None, "mosquitto stopped: " + log.read_text()  # port taken?
        yield ports
    finally:
        process.terminate()
        process.wait(timeout=WAIT_S)
