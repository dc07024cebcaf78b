"""Hot reload by dropping a model into the watched directory, while a serial node streams.

The deployer swaps a symlink (atomic, so the watcher never sees half a model). Version 2 is
found by polling and takes over without losing the windows; a corrupt version 3 (sha256
mismatch) is refused once and version 2 keeps calibrating, with its own values.
(tests/gateway/core/test_service.py covers reload on SIGHUP / ``tesla-gateway reload``.)
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    N,
    P,
    SerialNode,
    grid_base,
    iso,
    litert_expected,
    wait_for,
    windows_ending_at,
    write_config,
)
from tests.support.models import ModelFactory, corrupt_model_file
from tests.support.published import as_published

PHASES = ((0, N + 1), (N + 1, N + 3), (N + 3, N + 5))  # [start, end) periods per model phase
PERIODS = PHASES[-1][1]


def point_at(link: Path, target: Path) -> None:
    """Swap the model directory symlink atomically (rename over the old link)."""
    temporary = link.with_name(link.name + ".new")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    temporary.replace(link)


def test_dropped_in_model_is_validated_before_it_serves(
    tmp_path: Path,
    mosquitto: Mosquitto,
    pty_serial: PtySerial,
    model_factory: ModelFactory,
    daemons: list[Daemon],
) -> None:
    v1 = model_factory.copy(tmp_path / "v1", **MODEL)
    v2 = model_factory.copy(tmp_path / "v2", version=2, seed=5, **MODEL)
    v3 = model_factory.copy(tmp_path / "v3", version=3, seed=6, **MODEL)
    corrupt_model_file(v3.path)
    link = tmp_path / "pm10-model"
    point_at(link, v1.path)
    config = write_config(
        tmp_path, mosquitto, link, serial_ports=[pty_serial.path], model_poll_s=0.1
    )
    node = SerialNode(pty_serial, "node-h")
    calibrated = Calibrated(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state", nodes=[node]))
        daemon = daemons[-1]
        base = grid_base(PERIODS + 5)
        values = np.random.default_rng(8).uniform(5, 100, PERIODS).round(2)

        def stream(start: int, end: int) -> None:
            for period in range(start, end):
                node.send(base + period * P + 6, float(values[period]))
            wait_for(partial(calibrated.has, "node-h", end), f"periods up to {end - 1}")

        stream(*PHASES[0])
        point_at(link, v2.path)
        wait_for(lambda: daemon.status()["models"]["pm10"]["version"] == 2, "version 2")
        stream(*PHASES[1])
        point_at(link, v3.path)
        models = wait_for(
            lambda: (m := daemon.status()["models"]["pm10"])["rejected"] == 1 and m,
            "the corrupt version to be refused",
        )
        assert models["version"] == 2
        assert "sha256" in models["last_error"]
        stream(*PHASES[2])

        got = calibrated.by_period("node-h")
        for model, version, (start, end) in ((v1, 1, PHASES[0]), (v2, 2, (PHASES[1][0], PERIODS))):
            periods = list(range(max(start, N - 1), end))
            expected = litert_expected(model.path, windows_ending_at(values, periods))
            for period, value in zip(periods, expected, strict=True):
                payload = got[iso(base + period * P)]
                assert payload["quality"] == ["ok"], period  # windows survived the swaps
                assert payload["model_version"] == version, period
                assert payload["calibrated"] == as_published(float(value))
        assert daemon.status()["models"]["pm10"]["rejected"] == 1  # refused once, not retried
        assert daemon.stop() == 0
    finally:
        calibrated.close()
