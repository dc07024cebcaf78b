"""Serial nodes unplugged and replugged, with garbage on the line, through the real daemon.

No Arduino board exists here: the node is a pty pair (devkit/pty.py) whose slave
side the daemon opens through pyserial at a stable symlink, as udev's /dev/serial/by-id gives
it; ``unplug`` closes both ends and removes the link, ``replug`` makes a new pair behind it.
Every valid line written while plugged must become a reading and each garbage line one counted
reject; after each replug the daemon finds the port again by itself.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.sources.line_protocol import encode_hello, encode_hello_request, encode_reading
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    copy_default_model,
    delivery_figures,
    grid_base,
    iso,
    report,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.reliability


def lines_read(daemon: Daemon, readings: int, garbage: int) -> bool:
    """The daemon has taken in every reading and counted every garbage line as a reject."""
    status = daemon.status()
    return bool(status.get("readings_in") == readings and status["rejected"]["total"] == garbage)


GARBAGE = bytes(b for b in range(256) if b not in (0x0A, 0x0D))


def test_unplug_replug_with_garbage(tmp_path: Path, mosquitto: Mosquitto, long_form: bool) -> None:
    cycles, periods_per_cycle = (12, 8) if long_form else (4, 5)
    rng = random.Random(3)
    device = PtySerial(tmp_path / "ttyNODE0")
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-s",
        model_dir=model,
        broker_port=mosquitto.port,
        serial_port=device.path,
        mqtt=False,
    )
    collector = Collector(mosquitto.port)
    daemon = Daemon(config, tmp_path / "state")
    base = grid_base(cycles * periods_per_cycle + 5)
    expected: set[tuple[str, str, str]] = set()
    sent = garbage_lines = seq = period = 0
    try:
        for cycle in range(cycles):
            device.read_until(encode_hello_request().rstrip(b"\n"))  # the daemon opened it
            device.write(encode_hello("node-7", "1.0.0"))  # as the firmware answers it
            for _ in range(periods_per_cycle):
                timestamp = base + period * PERIOD_S + 30
                device.write(encode_reading("node-7", seq, timestamp, {"pm10": rng.uniform(5, 90)}))
                expected.add(("gw-s", "node-7", iso(base + period * PERIOD_S)))
                sent += 1
                seq += 1
                period += 1
                for _ in range(rng.randint(0, 2)):
                    length = rng.randint(1, 120)
                    device.write(bytes(rng.choice(GARBAGE) for _ in range(length)) + b"\n")
                    garbage_lines += 1
            wait_for(
                partial(lines_read, daemon, sent, garbage_lines),
                "every line read",
            )
            if cycle < cycles - 1:
                device.unplug()
                device.replug()
        wait_for(lambda: all(collector.snapshot()[key] for key in expected), "all periods out")
        status = daemon.status()
        assert daemon.stop() == 0
    finally:
        device.close()
        collector.close()
        daemon.kill()
    figures = delivery_figures(expected, collector.snapshot())
    figures |= {
        "replugs": cycles - 1,
        "lines_sent": sent,
        "readings_accepted": status["readings_in"],
        "garbage_lines": garbage_lines,
        "rejects_counted": status["rejected"]["total"],
        "rejects_by_reason": status["rejected"]["by_reason"],
    }
    report("serial_replug", figures)
    assert figures["lost"] == 0 and figures["duplicated"] == 0
