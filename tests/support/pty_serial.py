"""Pseudo-terminal pairs standing in for USB serial adapters (no Arduino board exists here).

The gateway opens a stable path (a symlink, as udev's /dev/serial/by-id/... would be) through
pyserial; the test drives the master side. ``unplug()`` closes the pair and removes the link, as
pulling the USB cable does; ``replug()`` creates a new pair and points the same link at it.
"""

from __future__ import annotations

import os
import select
import time
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["PtySerial", "pty_serial"]


class PtySerial:
    """One re-pluggable fake serial device at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._master: int | None = None
        self._slave: int | None = None
        self.replug()

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
        if self._master is None:
            raise RuntimeError("unplugged")
        view = memoryview(data)
        while view:
            written = os.write(self._master, view)
            view = view[written:]

    def read_available(self, timeout_s: float = 0.0) -> bytes:
        """Bytes the gateway wrote to the "device" (waits up to ``timeout_s`` for the first)."""
        if self._master is None:
            raise RuntimeError("unplugged")
        chunks: list[bytes] = []
        wait = timeout_s
        while True:
            ready, _, _ = select.select([self._master], [], [], wait)
            if not ready:
                break
            chunks.append(os.read(self._master, 4096))
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


@pytest.fixture
def pty_serial(tmp_path: Path) -> Iterator[PtySerial]:
    """A pluggable fake serial device at ``tmp_path / 'ttyNODE0'``."""
    device = PtySerial(tmp_path / "ttyNODE0")
    try:
        yield device
    finally:
        device.close()
