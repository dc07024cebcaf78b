"""systemd's notify protocol, spoken directly: one datagram per state change to $NOTIFY_SOCKET.

No dependency: the protocol is a datagram of ``KEY=VALUE`` lines to a unix socket whose path is
in the environment (a leading ``@`` means the abstract namespace). Outside systemd the variable
is unset and every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

__all__ = ["SdNotifier"]

_log = structlog.get_logger(__name__)


class SdNotifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING; failures are logged once, never raised."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | None = None
        if address:
            self._address = "\0" + address[1:] if address.startswith("@") else address
        watchdog_usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval_s: float | None = (
            int(watchdog_usec) / 1_000_000 / 2 if watchdog_usec.isdigit() else None
        )
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str) -> bool:
        """Send ``KEY=value`` lines (keys upper-cased); True if the datagram was sent."""
        if self._address is None:
            return False
        message = "\n".join(f"{key.upper()}={value}" for key, value in fields.items())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block the event loop: if the receiver's queue is full, drop and report.
                sock.setblocking(False)
                sock.sendto(message.encode("utf-8"), self._address)
        except OSError as exc:
            if not self._warned:
                _log.warning("sd_notify_failed", socket=self._address, error=str(exc))
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready="1", status=status)

    def status(self, status: str) -> bool:
        return self.notify(status=status)

    def watchdog(self) -> bool:
        return self.notify(watchdog="1")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(stopping="1", status=status)
