"""One cluster demo run: three nats-servers (R3, MQTT listeners), three gateways in cluster mode,
the demo slice's nodes publishing MQTT to the servers, one gateway SIGKILLed mid-run, a live
view, then the verdict from the calibrated stream itself. Everything started is stopped.

The slice is from 2020; cluster mode reads readings with the MQTT source's default rules (at
most a week old), so the replay moves the slice by whole days to end an hour ago: periods, times
of day and values stay as recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from devkit.cluster_demo.members import ClusterGroup, Member, member_configs
from devkit.cluster_demo.streams import no_stale_pulls, read_stream, sensor_partitions
from devkit.cluster_demo.tally import (
    SensorTally,
    expected_periods,
    format_verdict,
    reading_key,
    readings_lost_and_duplicated,
    tally,
)
from devkit.demo.nodes import MqttNode, ReplayClock
from devkit.demo.replay_slice import DemoSlice, SliceRow, load_slice
from devkit.errors import DevkitError
from devkit.log_capture import logging_to
from devkit.nats_servers import NatsCluster
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.mqtt.config import MqttBrokerConfig

__all__ = ["ClusterDemoOptions", "ClusterDemoOutcome", "run_cluster_demo", "shift_slice"]

_DAY_S = 86_400
_DRAIN_S = 30.0  # after the replay: the last periods are calibrated
_CALIBRATED_SUBJECT = "tesla.calibrated.>"


@dataclass(frozen=True, slots=True)
class ClusterDemoOptions:
    data: Path
    model_dirs: tuple[Path, ...]
    seconds: float = 60.0
    hours: float | None = None  # replay only the slice's first hours
    kill_at: float = 0.5  # fraction of the replay
    gateways: int = 3
    partitions: int = 6
    frame_s: float = 2.0
    keep: Path | None = None  # keep the servers' and gateways' files and logs there


@dataclass
class ClusterDemoOutcome:
    tallies: dict[str, SensorTally]
    victim: str = ""
    moved: list[int] = field(default_factory=list)  # the victim's partitions
    victim_sensors: list[str] = field(default_factory=list)
    before: dict[str, list[int]] = field(default_factory=dict)
    after: dict[str, list[int]] = field(default_factory=dict)
    failover_s: float | None = None  # kill to the first calibrated value of a moved sensor
    moved_in_s: float | None = None  # kill to every moved partition replayed by a survivor
    takeovers: dict[str, int] = field(default_factory=dict)
    readings_sent: int = 0
    readings_lost: int = 0  # sent, not in the readings stream
    readings_duplicated: int = 0
    exit_codes: dict[str, int | None] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return all(t.clean for t in self.tallies.values()) and self.failover_s is not None


def shift_slice(demo_slice: DemoSlice, now: float, hours: float | None) -> tuple[DemoSlice, int]:
    """The slice (its first ``hours``), moved by whole days to end at least an hour before
    ``now``; and the shift in seconds."""
    rows = demo_slice.rows
    if hours is not None:
        until = demo_slice.start + hours * 3600
        rows = {s: [r for r in rs if r.timestamp < until] for s, rs in rows.items()}
    end = max(r[-1].timestamp for r in rows.values())
    shift = int((now - 3600 - end) // _DAY_S) * _DAY_S
    moved = {
        s: [dataclasses.replace(r, timestamp=r.timestamp + shift) for r in rs]
        for s, rs in rows.items()
    }
    return DemoSlice(moved), shift


def run_cluster_demo(options: ClusterDemoOptions, out: TextIO) -> ClusterDemoOutcome:
    manifest = load_manifest(options.model_dirs[0])
    period_s = manifest.period_seconds
    demo_slice, shift = shift_slice(load_slice(options.data), time.time(), options.hours)
    span = demo_slice.end - demo_slice.start + period_s
    speed = span / options.seconds
    _say(
        out,
        f"TESLA cluster demo: {options.gateways} gateways, 3 nats-servers (R3), "
        f"{options.partitions} partitions, {len(demo_slice.sensor_ids)} sensors of the Ispra "
        f"slice replayed at {speed:.0f}x ({speed / period_s:.0f} periods/s); one gateway is "
        f"SIGKILLed at {options.kill_at:.0%} of the run",
    )
    with contextlib.ExitStack() as stack:
        if options.keep is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tesla-cluster-")))
        else:
            work = options.keep
            work.mkdir(parents=True, exist_ok=True)
        log_stream = stack.enter_context((work / "demo.log").open("w", encoding="utf-8"))
        stack.enter_context(logging_to(log_stream))  # the nodes' MQTT clients
        _say(out, "starting 3 nats-servers ...")
        cluster = stack.enter_context(NatsCluster(work / "nats"))
        configs = member_configs(
            work,
            options.gateways,
            [p.resolve() for p in options.model_dirs],
            cluster.urls,
            cluster.mqtt_ports,
            partitions=options.partitions,
        )
        _say(out, f"starting {options.gateways} gateways (logs in {work}/g*/daemon.log) ...")
        group = stack.enter_context(ClusterGroup([Member(c) for c in configs], options.partitions))
        group.wait_balanced()
        _wait_for_pulls_to_settle(cluster.urls, options.partitions)
        outcome = ClusterDemoOutcome(tallies={}, before=group.placement())
        _say(out, f"placement: {_placement_text(outcome.before)}")
        run = _Run(
            options=options,
            out=out,
            group=group,
            cluster=cluster,
            demo_slice=demo_slice,
            shift=shift,
            speed=speed,
            period_s=period_s,
            outcome=outcome,
        )
        asyncio.run(run.replay())
        messages = read_stream(cluster.urls, "TESLA_CALIBRATED")
        stored = [
            reading_key(m.subject, m.document) for m in read_stream(cluster.urls, "TESLA_READINGS")
        ]
        outcome.readings_sent = len(run.sent)
        outcome.readings_lost, outcome.readings_duplicated = readings_lost_and_duplicated(
            run.sent, stored
        )
        outcome.tallies = tally(expected_periods(run.sent, period_s), (m.msg_id for m in messages))
        for member in group.live:
            stats = member.cluster()
            for key in ("warm_takeovers", "cold_takeovers"):
                outcome.takeovers[key] = outcome.takeovers.get(key, 0) + int(stats.get(key, 0))
        group.stop()
        outcome.exit_codes = dict(group.exit_codes)
    _verdict(out, outcome, shift)
    return outcome


def _wait_for_pulls_to_settle(servers: list[str], partitions: int) -> None:
    """Before the replay: a reading landing in a released partition's last pull would stall
    that partition for the pin TTL and come back late (streams.no_stale_pulls)."""
    deadline = time.monotonic() + _DRAIN_S
    while not no_stale_pulls(servers, partitions):
        if time.monotonic() > deadline:
            raise DevkitError(f"released partitions' pulls still waiting after {_DRAIN_S:.0f} s")
        time.sleep(0.1)


class _Run:
    """The asyncio part: nodes, the live view, the kill, the drain."""

    def __init__(
        self,
        *,
        options: ClusterDemoOptions,
        out: TextIO,
        group: ClusterGroup,
        cluster: NatsCluster,
        demo_slice: DemoSlice,
        shift: int,
        speed: float,
        period_s: int,
        outcome: ClusterDemoOutcome,
    ) -> None:
        self.options, self.out, self.group, self.cluster = options, out, group, cluster
        self.slice, self.shift, self.speed, self.period_s = demo_slice, shift, speed, period_s
        self.outcome = outcome
        self.sent: list[tuple[str, float]] = []
        self.last: dict[str, int] = {}  # sensor -> last calibrated period start seen live
        self.seen: set[tuple[str, int]] = set()
        self.killed_at = 0.0
        self._decoded: dict[str, tuple[float, int]] = {}

    async def replay(self) -> None:
        import nats

        client = await nats.connect(servers=self.cluster.urls, connect_timeout=5)
        try:
            await client.subscribe(_CALIBRATED_SUBJECT, cb=self._on_calibrated)
            clock = ReplayClock(
                history_start=self.slice.start,
                speed=self.speed,
                wall_start=time.monotonic() + 0.2,
                wall_seconds=self.options.seconds,
            )
            nodes = [
                MqttNode(
                    sensor,
                    MqttBrokerConfig(
                        host="127.0.0.1",
                        port=self.cluster.mqtt_ports[index % len(self.cluster.mqtt_ports)],
                        protocol="3.1.1",
                    ),
                    iso_timestamps=index % 2 == 1,
                )
                for index, sensor in enumerate(self.slice.sensor_ids)
            ]
            async with asyncio.TaskGroup() as tasks:
                view = tasks.create_task(self._view(clock))
                kill = tasks.create_task(self._kill(clock))
                replays = [
                    tasks.create_task(n.replay(self.slice.rows[n.sensor_id], clock, self._on_sent))
                    for n in nodes
                ]
                await asyncio.wait(replays)
                await kill
                await self._drain()
                view.cancel()
            self._frame(clock)
        finally:
            await client.close()

    def _on_sent(self, sensor: str, row: SliceRow) -> None:
        self.sent.append((sensor, row.timestamp))

    async def _on_calibrated(self, message: object) -> None:
        headers = getattr(message, "headers", None) or {}
        sensor, _, start = str(headers.get("Nats-Msg-Id", "..0")).rsplit(".", 2)
        period = int(start)
        self.seen.add((sensor, period))
        self.last[sensor] = max(self.last.get(sensor, 0), period)
        if (
            self.killed_at
            and self.outcome.failover_s is None
            and sensor in self.outcome.victim_sensors
        ):
            self.outcome.failover_s = time.time() - self.killed_at

    async def _kill(self, clock: ReplayClock) -> None:
        due = clock.wall_start + self.options.kill_at * clock.wall_seconds
        await asyncio.sleep(max(due - time.monotonic(), 0))
        partition_of = await asyncio.to_thread(sensor_partitions, self.cluster.urls)
        placement = self.group.placement()

        def carried(name: str) -> list[str]:
            return sorted(s for s, p in partition_of.items() if p in placement[name])

        victim = max(placement, key=lambda name: (len(carried(name)), name))
        self.outcome.victim, self.outcome.moved = victim, placement[victim]
        self.outcome.victim_sensors = carried(victim)
        member = next(m for m in self.group.members if m.name == victim)
        self.killed_at = time.time()
        member.kill()
        _say(
            self.out,
            f">>> SIGKILL {victim}: partitions {_parts(placement[victim])}, sensors "
            f"{', '.join(self.outcome.victim_sensors) or 'none'}",
        )
        deadline = time.monotonic() + _DRAIN_S
        while not self.group.balanced():
            if time.monotonic() > deadline:
                raise DevkitError(
                    f"the survivors did not take {victim}'s partitions within {_DRAIN_S:.0f} s: "
                    f"{self.group.placement()}"
                )
            await asyncio.sleep(0.1)
        self.outcome.moved_in_s = time.time() - self.killed_at
        self.outcome.after = self.group.placement()
        _say(
            self.out,
            f">>> partitions moved in {self.outcome.moved_in_s:.1f} s: "
            f"{_placement_text(self.outcome.after)}",
        )

    async def _drain(self) -> None:
        """Until every period that must be calibrated has been seen, or a bounded wait."""
        expected = expected_periods(self.sent, self.period_s)
        due = {(s, p) for s, starts in expected.items() for p in starts}
        deadline = time.monotonic() + _DRAIN_S
        while not due <= self.seen and time.monotonic() < deadline:
            for member in self.group.live:
                member.daemon.check_alive()
            await asyncio.sleep(0.2)

    async def _view(self, clock: ReplayClock) -> None:
        while True:
            await asyncio.sleep(self.options.frame_s)
            self._frame(clock)

    def _frame(self, clock: ReplayClock) -> None:
        elapsed = time.monotonic() - clock.wall_start
        history = min(clock.history_now(), self.slice.end) - self.shift
        lines = [f"[{elapsed:5.1f} s] replay at {_hhmm(history, day=True)}"]
        now = time.monotonic()
        for member in self.group.members:
            if member.killed:
                lines.append(f"  {member.name}  KILLED (had {_parts(self.outcome.moved)})")
                continue
            decoded = member.decoded()
            then, before = self._decoded.get(member.name, (now, decoded))
            rate = (decoded - before) / (now - then) if now > then else 0.0
            self._decoded[member.name] = (now, decoded)
            lines.append(
                f"  {member.name}  partitions {_parts(member.partitions()):<12} "
                f"{rate:6.1f} readings/s"
            )
        last = "  ".join(
            f"{s} {_hhmm(self.last[s] - self.shift) if s in self.last else '--:--'}"
            for s in self.slice.sensor_ids
        )
        lines.append(f"  last calibrated period: {last}")
        _say(self.out, "\n".join(lines))


def _verdict(out: TextIO, outcome: ClusterDemoOutcome, shift: int) -> None:
    lines = ["", *format_verdict(outcome.tallies)]
    for item in outcome.tallies.values():
        if item.missing:
            shown = ", ".join(_hhmm(start - shift, day=True) for start in item.missing[:5])
            lines.append(f"  {item.sensor} missing: {shown}")
    failover = "none seen" if outcome.failover_s is None else f"{outcome.failover_s:.1f} s"
    lines.append(
        f"readings: {outcome.readings_sent} sent, {outcome.readings_lost} lost, "
        f"{outcome.readings_duplicated} stored twice"
    )
    lines.append(
        f"killed {outcome.victim} (partitions {_parts(outcome.moved)}, sensors "
        f"{', '.join(outcome.victim_sensors) or 'none'}); first value of a moved sensor after "
        f"{failover}; takeovers warm {outcome.takeovers.get('warm_takeovers', 0)}, cold "
        f"{outcome.takeovers.get('cold_takeovers', 0)}"
    )
    gaps = sum(len(t.missing) for t in outcome.tallies.values())
    duplicates = sum(t.duplicates for t in outcome.tallies.values())
    verdict = "PASS" if outcome.clean else "FAIL"
    lines.append(
        f"verdict: {verdict}: {gaps} gaps, {duplicates} duplicates in the calibrated series"
    )
    _say(out, "\n".join(lines))


def _parts(partitions: list[int]) -> str:
    return ",".join(map(str, partitions)) or "-"


def _placement_text(placement: dict[str, list[int]]) -> str:
    return "  ".join(f"{name}: {_parts(parts)}" for name, parts in sorted(placement.items()))


def _hhmm(timestamp: float, *, day: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M" if day else "%H:%M", time.gmtime(timestamp))


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()
