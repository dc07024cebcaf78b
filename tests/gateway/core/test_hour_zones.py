"""The hour's standard offset is one per zone, whatever the season, however the zone is set and
whether or not the clock is set yet (attacks on the hour-of-day rule: Europe/Dublin's negative
DST gave +1 h when named and 0 from the system; America/Inuvik's 'standard' offset followed DST;
a Pi booted in 1970 agreed on its zone's 1970 offset in a cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tesla_gateway.cluster.agreement import shared_settings
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.contract.manifest import write_manifest
from tesla_gateway.contract.time_of_day import standard_offset_seconds
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.watch import ModelSet
from tests.support.models import ModelFactory

WINTER = 1_767_225_600  # 2026-01-01
NOW = 1_783_000_000.0  # 2026-07


def _offsets(zone: str) -> tuple[int, int]:
    code = (
        "from tesla_gateway.contract.time_of_day import utc_offset_for as f;"
        f"print(f({zone!r}, {WINTER}), f(None, {WINTER}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"TZ": zone}, capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), int(out[1])


def test_named_and_system_zone_agree_for_dublin() -> None:
    named, system = _offsets("Europe/Dublin")
    assert named == system  # it was 3600 named, 0 from the system


def test_dublin_takes_the_suns_offset_like_london() -> None:
    assert _offsets("Europe/Dublin")[0] == _offsets("Europe/London")[0]  # it was 3600 against 0


def test_inuvik_standard_offset_does_not_follow_dst() -> None:
    """America/Inuvik (MST, -7 h; MDT -6 h in summer). Python's zoneinfo infers dst() = 2 h
    for its MDT (from the zone's history), so standard_offset_seconds gives -8 h from March to
    November and -7 h in winter: the 'standard' offset switches with DST, exactly what the rule
    exists to avoid, and is 1 h off all summer (nodes are told -28800 too)."""
    winter = standard_offset_seconds("America/Inuvik", WINTER)
    summer = standard_offset_seconds("America/Inuvik", 1_783_000_000)  # 2026-07-02
    assert (winter, summer) == (-25200, -25200)  # it was (-25200, -28800)


@pytest.mark.parametrize("zone", ["Europe/Lisbon", "Asia/Kathmandu"])
def test_the_agreed_hour_offset_does_not_come_from_an_unset_clock(
    model_factory: ModelFactory,
    tmp_path: Path,
    zone: str,
) -> None:
    model = model_factory.copy(tmp_path / "m", extra_channels=("hour_sin", "hour_cos"))
    write_manifest(model.path, model.manifest.model_copy(update={"min_history_periods": 1}))
    models = ModelSet({"pm10": model.path})
    models.refresh()
    config = ClusterConfig(servers=["nats://127.0.0.1:4222"])

    def agreed(clock: float) -> object:
        ticker = Ticker(models, grace_s=5.0, clock=lambda: clock, timezone=zone)
        store = ticker.store.items()
        geometries = {slot: w.geometry for slot, w in store}
        offsets = {slot: w.utc_offset_s for slot, w in store}
        return shared_settings(config, geometries, offsets)["models"]["pm10"]["hour_utc_offset_s"]

    # it was Lisbon 3600 (1970) against 0 (2026), Kathmandu 19800 against 20700
    assert agreed(30.0) == agreed(NOW)
