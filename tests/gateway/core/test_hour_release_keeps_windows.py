"""A release that adds the hour of the day to a PM-only model (or drops it) keeps every
sensor's window: both rings hold the same readings; an attack found the swap reset them all
(6 h of history at N = 360), and snapshots and cluster partitions refused each other."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.agreement import differences, shared_settings
from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.window_parts import PartitionSnapshot
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.manifest import write_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.daemon.ticker import Ticker
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import StateStore
from tests.support.models import ModelFactory, copy_model_dir

P = 60
T0 = 1_700_000_040


def test_adding_the_hour_keeps_the_pm_history(model_factory: ModelFactory, tmp_path: Path) -> None:
    slot_dir = tmp_path / "pm10"
    plain = model_factory.copy(slot_dir)
    write_manifest(plain.path, plain.manifest.model_copy(update={"min_history_periods": 1}))
    models = ModelSet({"pm10": slot_dir})
    models.refresh()
    clock = [float(T0)]
    ticker = Ticker(models, grace_s=5.0, clock=lambda: clock[0], timezone="Europe/Rome")
    for period in range(5):
        ticker.ingest(Reading("a", T0 + period * P + 1, {"pm10": 20.0 + period}))
    before = ticker.store["pm10"].export_state().ring.copy()
    # the release: same slot, the hour model (same read channels: pm10 only)
    hour = model_factory.get(extra_channels=("hour_sin", "hour_cos"))
    assert models.release_slot("pm10", list(hour.manifest.channel_names)) == "pm10"
    copy_model_dir(hour, slot_dir)
    write_manifest(
        slot_dir,
        hour.manifest.model_copy(
            update={"min_history_periods": 1, "version": plain.manifest.version + 1}
        ),
    )
    results = models.refresh()
    assert models.loaded()["pm10"].geometry.hour_positions is not None, results
    reset = ticker.sync_models()
    assert reset == []  # it was ['pm10']: windows_reset, "model geometry changed"
    assert ticker.store["pm10"].geometry.hour_positions is not None, models.loaded()[
        "pm10"
    ].geometry
    after = ticker.store["pm10"].export_state().ring
    assert after.shape == before.shape

    np.testing.assert_array_equal(after, before)
    # a snapshot written by the PM-only model restores under the hour model, and back
    state = ticker.store["pm10"].export_state()
    hour_geometry = models.loaded()["pm10"].geometry
    plain_geometry = WindowGeometry(
        hour_geometry.window_length,
        hour_geometry.period_seconds,
        ("pm10",),
        hour_geometry.gap_policy,
    )
    store = StateStore(tmp_path / "state")
    assert store.save("pm10", ModelWindows.from_state(replace(state, geometry=plain_geometry)))
    restored = store.restore("pm10", hour_geometry)
    assert restored is not None
    np.testing.assert_array_equal(restored.export_state().ring, before)
    # cluster members part way through such a release still agree
    config = ClusterConfig(servers=["nats://127.0.0.1:4222"])
    with_hour = shared_settings(config, {"pm10": hour_geometry}, {"pm10": 3600})
    without = shared_settings(config, {"pm10": plain_geometry})
    assert differences(with_hour, without) == differences(without, with_hour) == []
    blob = window_parts.encode(
        PartitionSnapshot(sequence=7, states={"pm10": replace(state, geometry=plain_geometry)})
    )
    parts = window_parts.decode(blob, {"pm10": hour_geometry}, max_bytes=1 << 24)
    assert "pm10" in parts.states
