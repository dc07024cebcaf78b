"""The notify protocol over a real unix datagram socket (systemd itself cannot run here)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tesla_gateway.daemon.sd_notify import SdNotifier


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_ready_status_watchdog_stopping(notify_socket: socket.socket) -> None:
    address = notify_socket.getsockname()
    notifier = SdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "4000000"})
    assert notifier.enabled and notifier.watchdog_interval_s == 2.0
    assert notifier.ready("running")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=running"
    assert notifier.watchdog()
    assert notify_socket.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert notify_socket.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_abstract_namespace_socket() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0tesla-gateway-test-notify")
        sock.settimeout(5)
        notifier = SdNotifier({"NOTIFY_SOCKET": "@tesla-gateway-test-notify"})
        assert notifier.status("hello")
        assert sock.recv(4096) == b"STATUS=hello"


def test_outside_systemd_everything_is_a_no_op() -> None:
    notifier = SdNotifier({})
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    assert not notifier.ready("x")


def test_a_vanished_socket_is_reported_not_raised(tmp_path: Path) -> None:
    notifier = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not notifier.watchdog()
    assert not notifier.watchdog()


def test_a_full_receiver_queue_never_blocks(notify_socket: socket.socket) -> None:
    notifier = SdNotifier({"NOTIFY_SOCKET": notify_socket.getsockname()})
    results = [notifier.watchdog() for _ in range(500)]  # nobody reads: the queue fills up
    assert results[0] and not results[-1]
