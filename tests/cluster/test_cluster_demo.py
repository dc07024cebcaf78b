"""``make cluster-demo`` in a short form: three real nats-servers and three real gateway processes
on the demo slice's real readings (nodes simulated by MQTT clients: no board here), one gateway
SIGKILLed mid-run. Its partitions move to the survivors, no reading is lost or stored twice, and
every sensor's calibrated series has no gap and no duplicate."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import structlog
import structlog.testing

from devkit.cluster_demo.session import ClusterDemoOptions, run_cluster_demo, shift_slice
from devkit.cluster_demo.tally import (
    expected_periods,
    reading_key,
    readings_lost_and_duplicated,
    tally,
)
from devkit.demo.replay_slice import default_slice_path, load_slice

pytest.importorskip("nats")

ROOT = Path(__file__).resolve().parents[2]


def test_the_verdict_counts_gaps_duplicates_and_lost_readings() -> None:
    sent = [("a", 0.0), ("a", 61.0), ("a", 125.0), ("a", 190.0), ("b", 5.0), ("b", 70.0)]
    expected = expected_periods(sent, 60)
    assert expected == {"a": {0, 60, 120}, "b": {0}}  # the last, open period is not due
    ids = ["a.pm10.0", "a.pm10.0", "a.pm10.120", "a.pm10.180", "b.pm10.0", "b.rh.60"]
    tallies = tally(expected, ids)
    assert tallies["a"].missing == (60,) and tallies["a"].duplicates == 1
    assert not tallies["a"].clean and tallies["b"].clean
    stored = [("a", 0.0), ("a", 0.0), ("a", 61.0), ("b", 5.0)]
    assert readings_lost_and_duplicated(sent, stored) == (3, 1)
    assert reading_key("sensors.part.3.a", {"timestamp": "1970-01-01T00:01:01Z"}) == ("a", 61.0)
    assert reading_key("sensors.part.3.a", {"ts": 61}) == ("a", 61.0)


def test_shifted_slice_keeps_periods_and_ends_an_hour_ago() -> None:
    original = load_slice(default_slice_path())
    now = original.end + 30 * 86_400 + 1234.5
    shifted, shift = shift_slice(original, now, hours=2)
    assert shift % 86_400 == 0 and now - 3600 - 86_400 < shifted.end <= now - 3600
    for sensor, rows in shifted.rows.items():
        assert len(rows) == 120  # two hours of minutes
        assert [r.timestamp - shift for r in rows] == [
            r.timestamp for r in original.rows[sensor][:120]
        ]


def test_cluster_demo_short_run_moves_partitions_without_gaps(tmp_path: Path) -> None:
    out = io.StringIO()
    outcome = run_cluster_demo(
        ClusterDemoOptions(
            data=default_slice_path(),
            model_dirs=(ROOT / "models" / "pm10-ispra-1min",),
            seconds=16.0,
            hours=4.0,
            frame_s=1.0,
            keep=tmp_path / "run",
        ),
        out,
    )
    text = out.getvalue()
    print(text)
    survivors = {name for name in outcome.before if name != outcome.victim}
    assert outcome.victim_sensors, "the killed gateway carried no sensor"
    assert set(outcome.after) == survivors
    assert sorted(p for ps in outcome.after.values() for p in ps) == list(range(6))
    assert outcome.readings_sent > 0
    assert (outcome.readings_lost, outcome.readings_duplicated) == (0, 0)
    gaps = {s: t.missing for s, t in outcome.tallies.items() if t.missing}
    duplicates = {s: t.duplicates for s, t in outcome.tallies.items() if t.duplicates}
    assert (gaps, duplicates) == ({}, {})
    assert all(t.expected > 0 for t in outcome.tallies.values())
    assert outcome.failover_s is not None
    assert outcome.exit_codes == dict.fromkeys(survivors, 0)
    assert "KILLED" in text and "verdict: PASS" in text
    # The demo ran in this process: its log file is closed, and logging works as before it.
    with structlog.testing.capture_logs() as logs:
        structlog.get_logger("after").warning("after_the_demo")
    assert [entry["event"] for entry in logs] == ["after_the_demo"]
    structlog.get_logger("after").warning("after_the_demo")  # raised on a closed file before
