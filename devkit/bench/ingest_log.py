"""What the ingest log adds to a reading's way in, side by side with the path without it.

``python -m devkit.bench.ingest_log [--sensors 10000] [--messages 2000] [--rounds 21]`` prints
one JSON object.

Both sides run the MQTT source's own code for each message, as ``on_message`` does before the
PUBACK: ``MqttSource._decode`` (payload -> validated readings), ``put_nowait`` of each reading
into the hand-off queue, and ``commit_queued`` once per batch of acknowledgements (the
connection's ``before_ack``: 1 message per batch, the worst case, and 50); then the ingest
side's ``get_nowait`` of that batch. Side A uses a plain ``asyncio.Queue``; side B the daemon's
:class:`JournaledQueue` over a real :class:`IngestLog` in a temporary directory (the page cache
of the file system the temporary directory lives on; the daemon's fsync runs in a worker thread
once a second, off the loop, and is not part of this figure). Rounds alternate A/B; the median
of each side's CPU time (``time.process_time``: the machine may be shared) is reported, as µs
per reading, once with one reading per message and once with 10. Not part of ``make bench``: a
component figure, to hold against the end-to-end CPU per reading (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.ingest_log import IngestLog, JournaledQueue, commit_queued
from tesla_gateway.ingest.log_record import encode_record
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.sources.mqtt_source import MqttSource, MqttSourceConfig

__all__ = ["run_ingest_log_bench"]

T0 = 1_700_000_000.0


def _messages(sensors: int, count: int, per_message: int) -> list[InboundMessage]:
    out: list[InboundMessage] = []
    for index in range(count):
        sensor = f"sensor-{index % sensors:05d}"
        items = [
            {"ts": T0 + (index // sensors) * 10 + k, "pm10": 10.0 + (index + k) % 50}
            for k in range(per_message)
        ]
        payload = json.dumps(items[0] if per_message == 1 else items).encode()
        out.append(
            InboundMessage(topic=f"sensors/{sensor}/raw", payload=payload, qos=1, retain=False)
        )
    return out


def _work(
    source: MqttSource,
    queue: asyncio.Queue[Reading],
    messages: list[InboundMessage],
    messages_per_ack: int,
) -> Callable[[], None]:
    rejects = RejectCounter()
    decode = source._decode  # the source's own per-message code

    def run() -> None:
        for start in range(0, len(messages), messages_per_ack):
            for message in messages[start : start + messages_per_ack]:
                for reading in decode(message, rejects):
                    queue.put_nowait(reading)
            commit_queued(queue)  # what the connection calls before a batch's PUBACKs
            while not queue.empty():  # the ingest loop keeps the queue short
                queue.get_nowait()

    return run


def run_ingest_log_bench(sensors: int, messages: int, rounds: int = 21) -> dict[str, object]:
    source = MqttSource(
        MqttSourceConfig(max_age_s=None), gateway_id="bench", clock=lambda: T0 + 86_400
    )
    figures: dict[str, object] = {"sensors": sensors, "messages_per_round": messages}
    with tempfile.TemporaryDirectory(prefix="ingest-log-bench-") as directory:
        log = IngestLog(Path(directory), max_bytes=1 << 40, fsync_interval_s=None)
        list(log.replay())
        log.start()
        figures["file_system_of_log"] = _file_system(Path(directory))
        for per_message in (1, 10):
            batch = _messages(sensors, messages, per_message)
            readings = messages * per_message
            for per_ack in (1, 50):
                without, with_log = _cpu_us_per_reading(
                    _work(source, asyncio.Queue(), batch, per_ack),
                    _work(source, JournaledQueue(log), batch, per_ack),
                    readings,
                    rounds,
                )
                name = f"{per_message}_per_message_{per_ack}_per_write"
                figures[f"us_per_reading_without_log_{name}"] = round(without, 3)
                figures[f"us_per_reading_with_log_{name}"] = round(with_log, 3)
                figures[f"log_us_per_reading_{name}"] = round(with_log - without, 3)
                log.checkpoint_now(queued=0)  # as a snapshot would: keep the directory small
        log.close()
    sample = Reading("sensor-00042", T0, {"pm10": 12.5}, source="mqtt")
    figures["record_bytes_one_value"] = len(encode_record(sample))
    return figures


def _cpu_us_per_reading(
    without: Callable[[], None], with_log: Callable[[], None], readings: int, rounds: int
) -> tuple[float, float]:
    """Median CPU time of this process (not wall time: the machine is shared) per reading,
    rounds alternated A B, B A, ... so both sides see the same conditions."""
    times: tuple[list[float], list[float]] = ([], [])
    works = (without, with_log)
    for work in works:
        work()  # warm-up: caches, the encoder's per-sensor heads
    gc.freeze()  # as the daemon does after start-up: the messages are long-lived
    for round_index in range(rounds):
        for side in (0, 1) if round_index % 2 == 0 else (1, 0):
            started = time.process_time()
            works[side]()
            times[side].append((time.process_time() - started) / readings * 1e6)
    return statistics.median(times[0]), statistics.median(times[1])


def _file_system(path: Path) -> str:
    best = ("", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount, kind = fields[1], fields[2]
        if str(path.resolve()).startswith(mount) and len(mount) > len(best[0]):
            best = (mount, kind)
    return best[1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    figures = run_ingest_log_bench(args.sensors, args.messages, args.rounds)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
