"""The cluster mode's rules without servers: placement converges to at most ceil(P/G) per
gateway (also after a join and a leave), a partition's windows survive bytes and a merge
exactly, a gateway's own reading is the JSON a node would send, [cluster] is validated at the
edge, servers before 2.11 are refused, and the daemon loads nats only in cluster mode."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.cluster import window_parts
from tesla_gateway.cluster.engine import check_api_level
from tesla_gateway.cluster.errors import ServerTooOldError
from tesla_gateway.cluster.ownership import plan
from tesla_gateway.cluster.traffic import local_payload
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.errors import ConfigError
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from tesla_gateway.sources.payloads import decode_payload
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import CorruptSnapshotError
from tesla_gateway.windows.state import WindowState

pytest.importorskip("nats")

_MAX = 1 << 20  # bytes a snapshot may take


def _converge(members: list[str], holders: dict[int, str | None], partitions: int) -> None:
    """Every member applies its plan in turn (winning every free partition it asks for) until
    nobody moves; fails if that takes more rounds than partitions."""
    for _ in range(partitions + 2):
        moved = False
        for me in members:
            moves = plan(me, members, holders, partitions)
            for p in moves.release:
                holders[p] = None
                moved = True
            for p in moves.acquire:
                if holders[p] is None:
                    holders[p] = me
                    moved = True
        if not moved:
            return
    raise AssertionError(f"placement did not settle: {holders}")


def _assert_balanced(members: list[str], holders: dict[int, str | None], partitions: int) -> None:
    """Every partition held; nobody over ceil(P/G) nor under floor(P/G)."""
    counts = {m: sum(1 for h in holders.values() if h == m) for m in members}
    assert all(h in members for h in holders.values()), holders
    assert max(counts.values()) <= math.ceil(partitions / len(members)), counts
    assert min(counts.values()) >= partitions // len(members), counts


@pytest.mark.parametrize("partitions", [1, 5, 6, 12, 13])
@pytest.mark.parametrize("gateways", [1, 2, 3, 4])
def test_placement_is_balanced_after_start_join_and_leave(partitions: int, gateways: int) -> None:
    members = [f"g{i}" for i in range(gateways)]
    holders: dict[int, str | None] = dict.fromkeys(range(partitions))
    _converge(members, holders, partitions)
    _assert_balanced(members, holders, partitions)

    members.append("new")  # a gateway joins
    _converge(members, holders, partitions)
    _assert_balanced(members, holders, partitions)

    gone = members.pop(0)  # one dies: its leases expire
    holders.update({p: None for p, h in holders.items() if h == gone})
    _converge(members, holders, partitions)
    _assert_balanced(members, holders, partitions)


def _windows() -> ModelWindows:
    geometry = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
    windows = ModelWindows(geometry)
    for minute in range(7):
        for index, sensor in enumerate(["a", "b", "c"]):
            for second in (5.0, 35.0):
                reading = Reading(sensor, 6000.0 + minute * 60 + second, {"pm10": index + minute})
                windows.add(reading, arrival=0.0)
    return windows


def _rows(state: WindowState) -> dict[str, tuple[object, ...]]:
    return {
        sensor: (
            state.ring[row].tolist(),
            int(state.last_closed[row]),
            int(state.first_period[row]),
            state.last_obs_value[row].tolist(),
            int(state.open_period[row]),
            state.open_sum[row].tolist(),
            state.open_count[row].tolist(),
            sorted(state.open_seen[row]),
            int(state.pending_period[row]),
        )
        for row, sensor in enumerate(state.sensor_ids)
    }


def test_a_partitions_windows_survive_bytes_and_merge() -> None:
    original = _windows()
    original.ready_windows()  # the tick before a snapshot (it runs under the tick lock)
    state = original.export_state()
    part = window_parts.subset(state, {"a", "c"})
    blob = window_parts.encode(window_parts.PartitionSnapshot(41, {"pm10": part}))
    back = window_parts.decode(blob, {"pm10": original.geometry}, max_bytes=_MAX)
    assert back.sequence == 41
    assert _rows(back.states["pm10"]) == _rows(part)

    other_gateway = window_parts.remove(state, {"a", "c"})  # holds only b
    merged = ModelWindows.from_state(window_parts.merge(other_gateway, back.states["pm10"]))
    assert _rows(merged.export_state()) == _rows(state)
    for windows in (original, merged):
        windows.close_through(10**9)
    ours, theirs = original.ready_windows(), merged.ready_windows()
    order = np.argsort(np.array(ours.sensor_ids)), np.argsort(np.array(theirs.sensor_ids))
    assert np.array_equal(ours.windows[order[0]], theirs.windows[order[1]])


def test_a_backlog_waiting_for_a_tick_moves_with_its_partition() -> None:
    """A takeover while sensors have several closed periods waiting (a replay catching up):
    every one of them reaches the new owner, none is dropped as the pending one's elder."""
    original = _windows()
    original.ready_windows()  # the last tick
    for minute in range(7, 10):  # three more closed periods each, no tick between
        for index, sensor in enumerate(["a", "b", "c"]):
            original.add(Reading(sensor, 6000.0 + minute * 60 + 5, {"pm10": index}), arrival=0.0)
    state = original.export_state()
    assert len(state.waiting) == 6  # two each, beside each sensor's pending period
    blob = window_parts.encode(
        window_parts.PartitionSnapshot(7, {"pm10": window_parts.subset(state, {"a", "c"})})
    )
    part = window_parts.decode(blob, {"pm10": original.geometry}, max_bytes=_MAX).states["pm10"]
    assert sorted({item.sensor_id for item in part.waiting}) == ["a", "c"]
    merged = ModelWindows.from_state(
        window_parts.merge(window_parts.remove(state, {"a", "c"}), part)
    )
    ours, theirs = original.ready_windows(), merged.ready_windows()
    assert sorted(zip(ours.sensor_ids, ours.periods.tolist(), strict=True)) == sorted(
        zip(theirs.sensor_ids, theirs.periods.tolist(), strict=True)
    )
    assert len(theirs) == 9  # 3 periods x 3 sensors


def test_a_snapshot_of_another_geometry_is_left_out() -> None:
    original = _windows()
    blob = window_parts.encode(window_parts.PartitionSnapshot(1, {"pm10": original.export_state()}))
    longer = WindowGeometry(8, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
    assert window_parts.decode(blob, {"pm10": longer}, max_bytes=_MAX).states == {}
    with pytest.raises(CorruptSnapshotError, match=r"zip|format|pickle"):
        window_parts.decode(b"PK not a snapshot", {"pm10": original.geometry}, max_bytes=_MAX)


def test_own_reading_goes_out_as_a_nodes_json() -> None:
    reading = Reading("node-1", 1_790_000_000.25, {"pm10": 12.5, "rh": 40.0}, seq=7)
    decoded = decode_payload(
        local_payload(reading),
        topic_sensor_id="node-1",
        received_at=1_790_000_001.0,
        source="cluster",
        rules=MqttSourceConfig(max_age_s=None).payload_rules(),
    )
    (back,) = decoded.readings
    assert (back.sensor_id, back.timestamp, dict(back.values), back.seq) == (
        "node-1",
        1_790_000_000.25,
        {"pm10": 12.5, "rh": 40.0},
        7,
    )


def test_servers_before_2_11_are_refused() -> None:
    # $JS.API.INFO of nats-server 2.9/2.10: an "api" object without "level"
    old = {"type": "io.nats.jetstream.api.v1.account_info_response", "api": {"total": 3}}
    with pytest.raises(ServerTooOldError, match=r"2\.10\.4 at nats://x:4222 .* level 0.*2\.11"):
        check_api_level(old, "2.10.4", "nats://x:4222")
    assert check_api_level({"api": {"level": 5}}, "2.15.1", "nats://x:4222") == 5


def _config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "g1"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{tmp_path / "model"}"
[cluster]
servers = ["nats://127.0.0.1:4222"]
{extra}
""",
        encoding="utf-8",
    )
    return path


def test_cluster_config_is_checked_at_the_edge(tmp_path: Path) -> None:
    from tesla_gateway.daemon.config import load_config

    config = load_config(_config(tmp_path, "partitions = 8"))
    assert config.cluster is not None and config.cluster.partitions == 8
    with pytest.raises(ConfigError, match="calibrated_topic_prefix"):
        load_config(_config(tmp_path, 'calibrated_topic_prefix = "tesla/#"'))
    with pytest.raises(ConfigError, match=r"MQTT listener\): remove the .*\[\[sources\]\]"):
        load_config(_config(tmp_path, '[[sources]]\nkind = "mqtt"'))
    with pytest.raises(ConfigError, match="partitions"):
        load_config(_config(tmp_path, "partitions = 0"))


def test_the_daemon_loads_nats_only_for_a_cluster(tmp_path: Path) -> None:
    """Config and service modules import no nats, with or without [cluster] (it comes with
    the member's first connection)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from tesla_gateway.daemon.config import load_config\n"
        "import tesla_gateway.daemon.service\n"
        f"assert load_config(Path({str(_config(tmp_path, ''))!r})).cluster is not None\n"
        "print(sorted(m for m in sys.modules if m == 'nats' or m.startswith('nats.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    assert result.stdout.strip() == "[]"
