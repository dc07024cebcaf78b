"""A frozen sensor beside a reference that reports sparsely: the gateway's ``stuck`` flag, written
to the pairs files, makes retraining drop the run that training's own rule cannot see.

On a 1-minute grid a reference reporting every 10 minutes leaves one pair row per 10 periods, so a
40-period frozen run is 4 rows: far below cleaning's 30 identical rows. Real ReferencePairing and
PairsWriter; the sensor's published periods are built as the ticker publishes them (``stuck``
from the run's ``STUCK_PERIODS``-th period on, calibrated withheld) without loading a model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.stuck import STUCK_PERIODS
from tesla_gateway.monitor.pairs import PairsWriter
from tesla_gateway.monitor.references import Pair, ReferenceConfig, ReferencePairing
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from training.data import clean, read_pairs

PERIOD = 60
T0 = 1_700_006_400 - 1_700_006_400 % 600  # a 10-minute boundary
BEFORE, FROZEN, AFTER = 40, STUCK_PERIODS + 10, 40
REFERENCE_EVERY = 10  # periods


def published(period: int, raw: float, run: int) -> CalibratedReading:
    """The sensor's period as the ticker publishes it, ``run`` periods into a run of ``raw``."""
    stuck = run >= STUCK_PERIODS
    return CalibratedReading(
        sensor_id="s1",
        feature="pm10",
        period_start=float(T0 + period * PERIOD),
        period_seconds=PERIOD,
        raw=raw,
        calibrated=None if stuck else raw * 0.8,
        unit="ug/m3",
        model_name="pm10",
        model_version=3,
        quality=(Quality.STUCK,) if stuck else (Quality.OK,),
    )


def record_pairs(directory: Path) -> int:
    """Pair the sensor's periods with the sparse reference and write them; the rows written."""
    rng = np.random.default_rng(1)
    raws = np.r_[
        np.round(rng.gamma(3, 8, BEFORE)) + 1,
        np.zeros(FROZEN),
        np.round(rng.gamma(3, 8, AFTER)) + 1,
    ]
    config = ReferenceConfig(
        name="ref",
        feature="pm10",
        colocated_with=["s1"],
        mqtt=MqttSourceConfig(topics=["refs/ref"]),
    )
    pairing = ReferencePairing(config, max_pending_periods=1000)
    pairs: list[Pair] = []
    run = 0
    for period, raw in enumerate(raws.tolist()):
        run = run + 1 if period and raw == raws[period - 1] else 1
        pairs += pairing.observe_sensor(published(period, raw, run))
    for period in range(0, len(raws) + REFERENCE_EVERY, REFERENCE_EVERY):
        reading = Reading("ref", T0 + period * PERIOD + 5, {"pm10": 20.0})
        pairs += pairing.observe_reference(reading, PERIOD, 0.0)
    writer = PairsWriter(directory, max_file_bytes=1 << 20)
    written = writer.append([pair.row for pair in pairs])
    writer.close()
    return written


def test_a_frozen_run_of_few_pair_rows_is_dropped_whole(tmp_path: Path) -> None:
    directory = tmp_path / "pairs" / "pm10"
    written = record_pairs(directory)
    frozen_rows = FROZEN // REFERENCE_EVERY
    assert written == (BEFORE + FROZEN + AFTER) // REFERENCE_EVERY
    text = "".join(path.read_text() for path in sorted(directory.iterdir()))
    # The scenario: fewer rows of the run than cleaning's rule needs; only its last one flagged.
    assert text.count(",s1,0.0,") == frozen_rows < STUCK_PERIODS
    assert text.count(",stuck\n") == 1

    pairs = read_pairs(directory, period_seconds=PERIOD)
    cleaned, report = clean(pairs.data)
    assert (cleaned.frame["raw"] == 0.0).sum() == 0
    # The flagged row and, in hindsight, the run's earlier rows (published ok): counted once.
    assert report.rows_dropped == {"raw:stuck": frozen_rows}
    assert report.rows_kept == written - frozen_rows
    assert report.rows_read == report.rows_kept + sum(report.rows_dropped.values())
    # The live rows on either side of the run stay.
    stamps = (cleaned.frame["timestamp"].astype("int64") // 10**9 - T0) // PERIOD
    assert stamps.tolist() == [
        p
        for p in range(0, BEFORE + FROZEN + AFTER, REFERENCE_EVERY)
        if not BEFORE <= p < BEFORE + FROZEN
    ]
