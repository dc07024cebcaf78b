"""The physical limit of the end-to-end figures: what the broker itself delivers per second.

``python -m devkit.bench.broker_limit [--messages N] [--sensors S]`` prints one JSON object.

The daemon is an MQTT subscriber that does work per message; the fastest possible subscriber does
none. This runs the end-to-end bench's set-up with the daemon replaced by mosquitto's own C
client: the same private mosquitto (no persistence, ``max_inflight_messages 1000``,
TCP_NODELAY), the same publisher (``devkit.bench.mqtt_wire.WirePublisher``: QoS 1, PUBLISH
packets written 500 per write, payloads encoded as it goes, exactly the closed loop's one-reading
messages on S = 10,000 sensor topics), and ``mosquitto_sub -q 1 -C N`` on the daemon's
subscription (``sensors/+/raw``), pinned to the CPU the daemon is pinned to there, everything
else on the others. The rate is N over the time from the first PUBLISH written to the
subscriber's exit after its N-th message.

``fraction_of_broker_S`` in ``make bench`` is the daemon's closed-loop rate over this one: the
share of what this broker, publisher and machine can carry that the daemon takes in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.bench.loadgen import SensorLoad
from devkit.bench.mqtt_wire import WirePublisher
from devkit.broker import Mosquitto
from devkit.errors import DevkitError

__all__ = ["BrokerClientsMissingError", "broker_forwarding_rate"]

_SUBSCRIBE_WAIT_S = 15.0
_RUN_TIMEOUT_S = 300.0


class BrokerClientsMissingError(DevkitError):
    """mosquitto_pub / mosquitto_sub are not installed (Debian package mosquitto-clients)."""


def _subscriber() -> str:
    sub = shutil.which("mosquitto_sub")
    if sub is None:
        raise BrokerClientsMissingError(
            "mosquitto_sub not found: install the Debian package mosquitto-clients "
            "(scripts/install-system-deps.sh does)"
        )
    return sub


def _wait_subscribed(host: str, port: int, timeout_s: float) -> None:
    """Until the broker reports a subscription besides ours ($SYS, once a second)."""
    counted = threading.Event()

    def on_message(_c: paho.Client, _u: object, message: paho.MQTTMessage) -> None:
        if int(message.payload or b"0") >= 2:  # the C subscriber's and this one's
            counted.set()

    watcher = paho.Client(CallbackAPIVersion.VERSION2, client_id="limit-watch")
    watcher.on_message = on_message
    watcher.connect(host, port)
    watcher.subscribe("$SYS/broker/subscriptions/count")
    watcher.loop_start()
    try:
        if not counted.wait(timeout_s):
            raise DevkitError(f"mosquitto_sub did not subscribe within {timeout_s:.0f} s")
    finally:
        watcher.disconnect()
        watcher.loop_stop()


def _packet_ids(sent: int, count: int) -> list[int]:
    """The ids WirePublisher.packet_ids gives the messages after the first ``sent``."""
    return [(sent + i) % 65_535 + 1 for i in range(count)]


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    """A child's pre-exec step that pins it to ``cpu`` (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def broker_forwarding_rate(messages: int = 200_000, sensors: int = 10_000) -> dict[str, float]:
    """Messages per second from the bench's publisher through the broker to a C subscriber."""
    sub = _subscriber()
    cpus = sorted(os.sched_getaffinity(0))
    subscriber_cpu = cpus[0] if len(cpus) >= 2 else None
    if subscriber_cpu is not None:
        os.sched_setaffinity(0, set(cpus[1:]))
    try:
        with tempfile.TemporaryDirectory(prefix="tesla-bench-broker-") as temp:
            broker = Mosquitto(
                Path(temp) / "broker",
                persistence=False,
                max_inflight_messages=1000,
                max_queued_messages=messages + sensors,  # none dropped if the reader lags
                sys_interval_s=1,
                new_session=True,
            )
            with broker:
                elapsed = _forward(broker, sub, messages, sensors, subscriber_cpu)
    finally:
        if subscriber_cpu is not None:
            os.sched_setaffinity(0, set(cpus))
    counted = -(-messages // sensors) * sensors
    return {
        "broker_messages": float(counted),
        "broker_forward_s": elapsed,
        "broker_forward_per_s": counted / elapsed,
    }


def _forward(broker: Mosquitto, sub: str, messages: int, sensors: int, cpu: int | None) -> float:
    """Seconds from the first PUBLISH written to the subscriber's exit after the last."""
    load = SensorLoad(sensors, int(time.time()) - 86_400, stride=1, batch=1)
    rounds = -(-messages // sensors)
    address = ["-h", broker.host, "-p", str(broker.port), "-q", "1"]
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    subscriber = subprocess.Popen(  # noqa: S603 - mosquitto's own client, no shell
        [
            sub,
            *address,
            "-i",
            "limit-sub",
            "-t",
            "sensors/+/raw",
            "-C",
            str(rounds * sensors),
            "-N",
            "-F",
            "",
        ],
        stdout=subprocess.DEVNULL,
        stderr=errors,
        preexec_fn=_pinned(cpu),  # noqa: PLW1509 - only sched_setaffinity, no locks
    )
    publisher: WirePublisher | None = None
    try:
        _wait_subscribed(broker.host, broker.port, _SUBSCRIBE_WAIT_S)
        publisher = WirePublisher(broker.host, broker.port, "limit-pub")
        # Encoded before the clock starts (as a C publisher would cost next to nothing), with
        # the packet ids WirePublisher.packet_ids hands out in order.
        chunk = 500  # as the end-to-end bench's closed loop writes them
        writes: list[tuple[bytes, int]] = []
        sent = 0
        for _ in range(rounds):
            for start in range(0, sensors, chunk):
                stop = min(sensors, start + chunk)
                ids = _packet_ids(sent, stop - start)
                sent += stop - start
                writes.append((load.packets(start, stop, ids), stop - start))
            load.round += 1
        started = time.perf_counter()
        for packets, count in writes:
            publisher.packet_ids(count)  # waits while too many are unacknowledged
            publisher.send(packets, count)
        subscriber.wait(_RUN_TIMEOUT_S)
        elapsed = time.perf_counter() - started
        if subscriber.returncode != 0:
            errors.seek(0)
            raise DevkitError(f"mosquitto_sub failed: {errors.read()[-500:]!r}")
        return elapsed
    finally:
        if publisher is not None:
            publisher.close()
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()
        errors.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--sensors", type=int, default=10_000)
    args = parser.parse_args(argv)
    print(json.dumps(broker_forwarding_rate(args.messages, args.sensors)))


if __name__ == "__main__":
    main()
