"""A soak: steady load through the real daemon for a bounded time on loopback, with its memory
(RSS), open file descriptors and queue depths sampled at the start (after warm-up) and the end.

Short form 10 s, long form 120 s. The sensors replay the recent past at a steady
``READINGS_PER_S`` (every reading closes its sensor's previous period, so as many calibrations
per second), so a short run covers a hundred periods per sensor; the outbox depth is sampled
while the load runs, as well as after it drained.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from devkit.broker import Mosquitto
from tests.reliability.harness import (
    PERIOD_S,
    Collector,
    Daemon,
    Sensors,
    copy_default_model,
    delivery_figures,
    grid_base,
    iso,
    report,
    wait_for,
    wait_while_progressing,
    write_config,
)

pytestmark = pytest.mark.reliability
SENSORS = 40
READINGS_PER_S = 400  # steady, well below what the daemon sustains (issue 7 measures that)


def sample(daemon: Daemon) -> dict[str, Any]:
    status = daemon.status()
    return {
        "rss_kib": daemon.rss_kib(),
        "open_fds": daemon.open_fds(),
        "outbox_queued": status.get("publisher", {}).get("queued"),
        "readings_in": status.get("readings_in"),
        "published": status.get("ticker", {}).get("published"),
    }


def readings_at_least(daemon: Daemon, count: int) -> bool:
    return bool(daemon.status().get("readings_in", 0) >= count)


def test_soak(tmp_path: Path, mosquitto: Mosquitto, long_form: bool) -> None:
    duration_s = 120.0 if long_form else 10.0
    warm_up_periods = 20
    model = copy_default_model(tmp_path / "model")
    config = write_config(
        tmp_path / "gw.toml",
        gateway_id="gw-soak",
        model_dir=model,
        broker_port=mosquitto.port,
        save_interval_s=1.0,
    )
    collector = Collector(mosquitto.port)
    daemon = Daemon(config, tmp_path / "state")
    sensors = Sensors(mosquitto.port)
    names = [f"node-{i:02d}" for i in range(SENSORS)]
    max_periods = int(duration_s * READINGS_PER_S / SENSORS) + warm_up_periods
    base = grid_base(max_periods + 5)
    expected: set[tuple[str, str, str]] = set()
    try:
        period = 0
        start: dict[str, Any] = {}
        deadline = float("inf")
        paced_from = time.monotonic()
        while time.monotonic() < deadline and period < max_periods:
            delay = paced_from + period * SENSORS / READINGS_PER_S - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for name in names:
                sensors.send(name, base + period * PERIOD_S + 30, 10.0 + (period % 50))
                expected.add(("gw-soak", name, iso(base + period * PERIOD_S)))
            period += 1
            if period == warm_up_periods:
                wait_for(partial(readings_at_least, daemon, SENSORS * period), "warm")
                start = sample(daemon)
                deadline = time.monotonic() + duration_s
                paced_from = time.monotonic() - period * SENSORS / READINGS_PER_S
        under_load = sample(daemon)
        try:
            wait_while_progressing(
                lambda: all(collector.snapshot()[key] for key in expected),
                lambda: sum(collector.snapshot().values()),
                "every message",
            )
        except AssertionError as exc:
            missing = sorted(key for key in expected if not collector.snapshot()[key])
            status = daemon.status()
            raise AssertionError(
                f"{exc}; {len(missing)} of {len(expected)} missing, e.g. {missing[:3]}; "
                f"publisher {status.get('publisher')}; ticker {status.get('ticker')}"
            ) from exc
        end = sample(daemon)
        assert daemon.stop() == 0
    finally:
        sensors.close()
        collector.close()
        daemon.kill()
    figures: dict[str, Any] = {**delivery_figures(expected, collector.snapshot())}
    figures |= {
        "duration_s": duration_s,
        "sensors": SENSORS,
        "periods": period,
        "readings_per_s": READINGS_PER_S,
        "start": start,
        "under_load": under_load,
        "end": end,
    }
    report("soak", figures)
    assert figures["lost"] == 0
    assert end["open_fds"] <= start["open_fds"] + 4
    assert end["rss_kib"] <= start["rss_kib"] * 1.25 + 16 * 1024
    assert end["outbox_queued"] == 0
