"""The cluster part of make bench, run small against real mosquitto, nats-server and gateway
processes: every figure is there and is a measurement (the failover figures come from the
cluster demo, tested in tests/cluster/test_cluster_demo.py)."""

from __future__ import annotations

import math

import pytest

from devkit.bench.cluster import DEFAULT_MODEL, Load, measure, report

pytest.importorskip("nats")


def test_the_cluster_bench_measures_both_brokers_and_the_group() -> None:
    figures = measure(DEFAULT_MODEL, Load(sensors=60, seconds=2.0), failover=False)
    for key in (
        "cluster_mosquitto_readings_per_s",
        "cluster_jetstream_readings_per_s",
        "cluster_mosquitto_cpu_us_per_reading",
        "cluster_jetstream_cpu_us_per_reading",
        "cluster_single_cpu_us_per_reading",
        "cluster_group_g1_cpu_us_per_reading",
        "cluster_group_g2_cpu_us_per_reading",
        "cluster_cpu_per_reading_ratio",
    ):
        assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures)
    # both members of the group took readings (the partitions were shared)
    assert 0 < figures["cluster_group_readings_share"] <= 1
    rows: list[tuple[str, str]] = []
    report(figures, lambda label, value: rows.append((label, value)))
    assert any("cluster_cpu_per_reading_ratio" in label for label, _ in rows)
    assert not any("failover" in label for label, _ in rows)
