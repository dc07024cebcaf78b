"""The end-to-end benchmark's load generator: S simulated sensors publishing JSON readings.

Runs as its own process (``python -m devkit.bench.loadgen MODE ...``) so that it never shares the
daemon's interpreter. Every sensor ``node-<i>`` publishes on ``sensors/node-<i>/raw`` the payload
documented in docs/mqtt.md, ``{"ts": <unix s>, "pm10": <µg/m³>}`` (or, with ``--batch k``, a JSON
array of k consecutive readings of that sensor, as a node that buffers does), QoS 1.

Event time: a sensor's k-th reading has ``ts = t0 + k * stride``. Modes:

* ``realtime`` — every sensor publishes one message per wall-clock second, sensor i at offset
  i/S within the second (unsynchronised nodes, spread evenly), for ``--rounds`` seconds. For each
  round that opens a new period (its reading closes the previous one) the publication time of
  every sensor's reading is written out, for the latency measurement.
* ``closedloop`` — as fast as the daemon ingests: never more than ``--backlog`` readings
  published but not yet counted in the daemon's status.json ``readings_in``; ends after
  ``--duration`` seconds at the end of a round. The rate it reaches is the daemon's capacity.
* ``paced`` — a fixed offered rate (``--rate`` readings/s) for ``--duration`` seconds, whatever
  the daemon does: the check that the daemon keeps up with a rate without a growing backlog.

Samples of (status time, published, ingested) are written to ``--out`` (JSON) for the analysis.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from devkit.bench.mqtt_wire import WirePublisher
from tesla_gateway.mqtt.wire import publish_packet

__all__ = ["main"]

_CHUNK_S = 0.002  # realtime/paced: send what is due every 2 ms


class SensorLoad:
    """Payloads of S sensors, round by round, continuing one event-time sequence."""

    def __init__(self, sensors: int, t0: int, stride: int, batch: int, seed: int = 7) -> None:
        rng = np.random.default_rng(seed)
        self.count = sensors
        self.topics = [f"sensors/node-{i:05d}/raw".encode() for i in range(sensors)]
        # Plain Python floats: formatting NumPy scalars costs several times more, and the
        # generator shares a core with the broker and the subscriber.
        self.level: list[float] = (rng.gamma(2.0, 12.0, size=sensors) + 2.0).tolist()
        self.noise: list[float] = rng.lognormal(0.0, 0.08, size=4096).tolist()
        self.t0, self.stride, self.batch = t0, stride, batch
        self.round = 0  # rounds completed: each sensor has sent round * batch readings

    def event_time(self, round_index: int, reading: int = 0) -> int:
        return self.t0 + (round_index * self.batch + reading) * self.stride

    def packets(self, start: int, stop: int, ids: list[int]) -> bytes:
        """PUBLISH packets of sensors [start, stop) for the current round."""
        parts: list[bytes] = []
        noise, level, b, topics = self.noise, self.level, self.batch, self.topics
        base = self.round * b
        ts0, stride = self.t0 + base * self.stride, self.stride
        for sensor, packet_id in zip(range(start, stop), ids, strict=True):
            if b == 1:
                value = level[sensor] * noise[(sensor * 31 + base) % 4096]
                payload = f'{{"ts":{ts0},"pm10":{value:.1f}}}'
            else:
                payload = "[" + ",".join(
                    f'{{"ts":{ts0 + j * stride},'
                    f'"pm10":{level[sensor] * noise[(sensor * 31 + base + j) % 4096]:.1f}}}'
                    for j in range(b)
                ) + "]"  # fmt: skip
            parts.append(publish_packet(topics[sensor], payload.encode(), packet_id))
        return b"".join(parts)


def _ingested(status_file: Path) -> tuple[float, int] | None:
    """(updated_at, readings_in) from the daemon's status.json, None while unreadable."""
    try:
        document = json.loads(status_file.read_text(encoding="utf-8"))
        return float(document["updated_at"]), int(document["readings_in"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _realtime(
    pub: WirePublisher, sensors: SensorLoad, rounds: int, period: int
) -> dict[str, object]:
    s = sensors.count
    boundaries: list[dict[str, object]] = []
    start = time.monotonic() + 0.05
    for r in range(rounds):
        ts = sensors.event_time(sensors.round)
        opens = r > 0 and ts // period != (ts - sensors.stride) // period
        stamps = np.zeros(s) if opens else None
        round_start = start + r
        sent = 0
        while sent < s:
            now = time.monotonic()
            due = min(s, int((now - round_start) * s) + 1) if now >= round_start else 0
            if due > sent:
                ids = pub.packet_ids(due - sent)
                data = sensors.packets(sent, due, ids)
                stamp = time.monotonic()
                pub.send(data, due - sent)
                if stamps is not None:
                    stamps[sent:due] = stamp
                sent = due
            if sent < s:
                time.sleep(_CHUNK_S)  # one write per 2 ms: what is due by then goes together
        if stamps is not None:
            boundaries.append({"closed_period": ts // period - 1, "published": stamps.tolist()})
        sensors.round += 1
    pub.wait_acked()
    return {"boundaries": boundaries}


def _closed_loop(
    pub: WirePublisher, sensors: SensorLoad, duration: float, backlog: int, status: Path
) -> dict[str, object]:
    base = _ingested(status)
    if base is None:
        raise SystemExit("the daemon's status.json is not readable")
    _, ingested0 = base
    samples: list[tuple[float, int, int]] = []
    last_seen = base
    chunk = max(1, min(500, backlog // 10))
    end = time.monotonic() + duration
    published = 0
    status_read = 0.0
    while True:
        for start in range(0, sensors.count, chunk):
            stop = min(sensors.count, start + chunk)
            while published * sensors.batch - (last_seen[1] - ingested0) > backlog:
                time.sleep(0.002)
                last_seen = _poll(status, last_seen, samples, published, sensors.batch, ingested0)
            ids = pub.packet_ids(stop - start)
            pub.send(sensors.packets(start, stop, ids), stop - start)
            published += stop - start
            if time.monotonic() - status_read > 0.01:
                status_read = time.monotonic()
                last_seen = _poll(status, last_seen, samples, published, sensors.batch, ingested0)
        sensors.round += 1
        if time.monotonic() >= end:
            break
    pub.wait_acked()
    return {"samples": samples, "readings_published": published * sensors.batch}


def _poll(  # noqa: PLR0917 - the loop's state, passed on every poll
    status: Path,
    last: tuple[float, int],
    samples: list[tuple[float, int, int]],
    published: int,
    batch: int,
    ingested0: int,
) -> tuple[float, int]:
    seen = _ingested(status)
    if seen is None or seen[0] == last[0]:
        return last
    samples.append((seen[0], published * batch, seen[1] - ingested0))
    return seen


def _paced(
    pub: WirePublisher, sensors: SensorLoad, rate: float, duration: float, status: Path
) -> dict[str, object]:
    base = _ingested(status)
    if base is None:
        raise SystemExit("the daemon's status.json is not readable")
    ingested0 = base[1]
    samples: list[tuple[float, int, int]] = []
    last_seen = base
    messages_per_s = rate / sensors.batch
    start = time.monotonic()
    published = 0
    position = 0  # sensor index within the current round
    while True:
        now = time.monotonic()
        if now - start >= duration and position == 0:
            break
        due = int((now - start) * messages_per_s) - published
        if due <= 0:
            time.sleep(_CHUNK_S)
            last_seen = _poll(status, last_seen, samples, published, sensors.batch, ingested0)
            continue
        stop = min(sensors.count, position + due)
        ids = pub.packet_ids(stop - position)
        pub.send(sensors.packets(position, stop, ids), stop - position)
        published += stop - position
        position = stop
        if position == sensors.count:
            position = 0
            sensors.round += 1
    pub.wait_acked()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # the tail after the last publish
        time.sleep(0.02)
        last_seen = _poll(status, last_seen, samples, published, sensors.batch, ingested0)
    return {"samples": samples, "readings_published": published * sensors.batch}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.bench.loadgen", description=__doc__)
    parser.add_argument("mode", choices=("realtime", "closedloop", "paced"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sensors", type=int, required=True)
    parser.add_argument("--t0", type=int, required=True, help="event time of the first reading")
    parser.add_argument("--stride", type=int, default=1, help="event seconds between readings")
    parser.add_argument("--batch", type=int, default=1, help="readings per message")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--period", type=int, default=60)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=10_000.0)
    parser.add_argument("--status", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    sensors = SensorLoad(args.sensors, args.t0, args.stride, args.batch)
    pub = WirePublisher("127.0.0.1", args.port, f"bench-loadgen-{args.mode}")
    try:
        if args.mode == "realtime":
            result = _realtime(pub, sensors, args.rounds, args.period)
        elif args.mode == "closedloop":
            result = _closed_loop(pub, sensors, args.duration, args.backlog, args.status)
        else:
            result = _paced(pub, sensors, args.rate, args.duration, args.status)
    finally:
        pub.close()
    result["next_t0"] = sensors.event_time(sensors.round)
    result["rounds"] = sensors.round
    args.out.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
