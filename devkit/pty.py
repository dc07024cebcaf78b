"""The one pty pair: a pseudo-terminal standing in for a node's USB serial adapter (no Arduino
board exists here), for the tests and the demo.

The gateway opens a stable path (a symlink, as udev's /dev/serial/by-id/... would be) through
pyserial; the test or the demo's node drives the master side. The slave side stays open too, so
the master never sees a hang-up while the daemon (re)opens the port. ``unplug()`` closes the
pair and removes the link, as pulling the USB cable does; ``replug()`` creates a new pair and
points the same link at it.
"""

from __future__ import annotations

import fcntl
import os
import select
import time
import tty
from pathlib import Path

from devkit.errors import DevkitError

__all__ = ["PtySerial", "UnpluggedError"]


class UnpluggedError(DevkitError):
    """The fake device was used while unplugged."""


class PtySerial:
    """One re-pluggable fake serial device at ``path``; ``contextlib.closing`` closes it.

    ``nonblocking=True`` makes the master side non-blocking, for a driver on an asyncio loop
    (``loop.add_reader(device.master, ...)``, ``os.write`` raising ``BlockingIOError``).
    """

    def __init__(self, path: Path, *, nonblocking: bool = False) -> None:
        self.path = path
        self._nonblocking = nonblocking
        self._master: int | None = None
        self._slave: int | None = None
        self.replug()

    @property
    def master(self) -> int:
        """The master side's file descriptor (the node's end of the cable)."""
        if self._master is None:
            raise UnpluggedError(f"{self.path} is unplugged")
        return self._master

    @property
    def plugged(self) -> bool:
        return self._master is not None

    def replug(self) -> None:
        """Create a fresh pty pair and point ``path`` at its slave side."""
        if self.plugged:
            self.unplug()
        master, slave = os.openpty()
        tty.setraw(master)
        tty.setraw(slave)
        if self._nonblocking:
            flags = fcntl.fcntl(master, fcntl.F_GETFL)
            fcntl.fcntl(master, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._master, self._slave = master, slave
        temporary = self.path.with_name(self.path.name + ".new")
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(os.ttyname(slave))
        temporary.replace(self.path)

    def unplug(self) -> None:
        """Close both ends (the reader sees EIO/hang-up) and remove the device path."""
        self.path.unlink(missing_ok=True)
        for fd in (self._master, self._slave):
            if fd is not None:
                os.close(fd)
        self._master = self._slave = None

    def write(self, data: bytes) -> None:
        """Bytes from the "device" to the gateway."""
        master = self.master
        view = memoryview(data)
        while view:
            written = os.write(master, view)
            view = view[written:]

    def read_available(self, timeout_s: float = 0.0) -> bytes:
        """Bytes the gateway wrote to the "device" (waits up to ``timeout_s`` for the first)."""
        master = self.master
        chunks: list[bytes] = []
        wait = timeout_s
        while True:
            ready, _, _ = select.select([master], [], [], wait)
            if not ready:
                break
            chunks.append(os.read(master, 4096))
            wait = 0.0
        return b"".join(chunks)

    def read_until(self, marker: bytes, timeout_s: float = 5.0) -> bytes:
        """Read what the gateway wrote until ``marker`` appears (or fail after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        data = b""
        while marker not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{marker!r} not received; got {data!r}")
            data += self.read_available(min(remaining, 0.1))
        return data

    def close(self) -> None:
        if self.plugged:
            self.unplug()
