"""SIGTERM with calibrated readings still unacknowledged: the shutdown flushes the outbox.

The broker is frozen (SIGSTOP: the TCP connection stays up, no PUBACK comes back), so the
last calibrated readings sit in the outbox awaiting acknowledgement. SIGTERM starts the
daemon's shutdown; once it has saved its windows (the step right before it stops the
publisher) the broker is thawed. The publisher must keep delivering during its
``shutdown_flush_s``: the daemon exits 0 with an empty outbox and the observer has every
period. (Before the fix in ``Publisher.serve``, cancelling the publisher also cancelled its
delivery task, so the flush waited out ``shutdown_flush_s`` and left the readings queued.)
"""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.publish.outbox import Outbox
from tesla_gateway.publish.publisher import OUTBOX_FILENAME
from tests.gateway.e2e.harness import (
    MODEL,
    WAIT_S,
    Calibrated,
    Daemon,
    N,
    P,
    SerialNode,
    grid_base,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory

BEFORE = N
UNACKED = 4
PERIODS = BEFORE + UNACKED


def test_sigterm_flushes_unacknowledged_readings_before_exit(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    model = model_factory.copy(tmp_path / "model", **MODEL)
    config = write_config(
        tmp_path, mosquitto, model.path, serial_ports=[pty_serial.path], shutdown_flush_s=20
    )
    state_dir = tmp_path / "state"
    node = SerialNode(pty_serial, "node-t")
    calibrated = Calibrated(mosquitto)
    assert mosquitto._process is not None
    broker_pid = mosquitto._process.pid
    try:
        daemons.append(Daemon(config, state_dir, nodes=[node]))
        daemon = daemons[-1]
        base = grid_base(PERIODS + 5)
        values = np.random.default_rng(4).uniform(5, 100, PERIODS).round(2)
        for period in range(BEFORE):
            node.send(base + period * P + 1, float(values[period]))
        wait_for(partial(calibrated.has, "node-t", BEFORE), "the first periods")

        os.kill(broker_pid, signal.SIGSTOP)
        for period in range(BEFORE, PERIODS):
            node.send(base + period * P + 1, float(values[period]))
        wait_for(
            lambda: daemon.status()["publisher"]["queued"] == UNACKED, "unacknowledged readings"
        )
        daemon.process.send_signal(signal.SIGTERM)
        wait_for((state_dir / "windows" / "pm10.npz").exists, "the shutdown's window save")
        os.kill(broker_pid, signal.SIGCONT)
        assert daemon.process.wait(timeout=WAIT_S) == 0

        with Outbox.open(state_dir / OUTBOX_FILENAME, max_messages=1000) as outbox:
            assert len(outbox) == 0
        final = json.loads((state_dir / "status.json").read_text())
        assert final["phase"] == "stopped"
        assert final["publisher"]["queued"] == 0
        assert final["publisher"]["published"] >= PERIODS
        wait_for(partial(calibrated.has, "node-t", PERIODS), "every period at the observer")
    finally:
        os.kill(broker_pid, signal.SIGCONT)
        calibrated.close()
