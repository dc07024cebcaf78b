"""The physical limit of the end-to-end figures: what the broker itself delivers per second.

``python -m devkit.bench.broker_limit [--sensors S] [--duration SECONDS]`` prints one JSON object.

The daemon is an MQTT subscriber that does work per message; the fastest possible subscriber does
next to none. This runs the end-to-end bench's closed loop exactly (the same private mosquitto:
no persistence, ``max_inflight_messages 1000``, TCP_NODELAY; the same load generator,
``devkit.bench.loadgen closedloop``: one-reading QoS 1 messages on S = 10,000 sensor topics, 500
per write, never more than 10,000 ahead of what the consumer has taken; the same rate, the slope
of the consumer's count after a 1 s warm-up) with the daemon replaced by ``limit_sub.c``, built
here with the system ``cc``: a QoS 1 subscriber to the daemon's subscription that reads 1 MiB at
a time, acknowledges every message of a read in one write and reports its count in a status file
as the daemon's status.json does. It is pinned to the CPU the daemon is pinned to there,
everything else to the others.

``fraction_of_broker_S`` in ``make bench`` is the daemon's closed-loop rate over this one: the
share of what this broker, load generator and machine can carry that the daemon takes in.
(``mosquitto_sub -q 1``, the first yardstick, acknowledges each message with a write of its own
and took fewer messages per second than the daemon: it measured itself, not the broker.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devkit.bench.end_to_end import BACKLOG, CLOSED_LOOP_S, ingest_rate, run_loadgen
from devkit.broker import Mosquitto
from devkit.errors import DevkitError

__all__ = ["CompilerMissingError", "broker_forwarding_rate", "build_subscriber"]

_SOURCE = Path(__file__).with_name("limit_sub.c")
_TOPIC = "sensors/+/raw"  # the daemon's subscription in the end-to-end bench
_UNBOUNDED = 10**15  # the subscriber's COUNT when the load generator decides the end
_STOP_WAIT_S = 10.0


class CompilerMissingError(DevkitError):
    """No C compiler to build the bench's subscriber (Debian package gcc)."""


def build_subscriber(directory: Path) -> Path:
    """``limit_sub.c`` compiled into ``directory`` (a fraction of a second with -O2)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CompilerMissingError(
            "no C compiler (cc) to build devkit/bench/limit_sub.c: install the Debian package "
            "gcc (scripts/install-system-deps.sh does)"
        )
    binary = directory / "limit_sub"
    built = subprocess.run(  # noqa: S603 - the system compiler on our own source, no shell
        [compiler, "-O2", "-o", str(binary), str(_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise DevkitError(f"cannot build {_SOURCE.name}: {built.stderr.strip()[-500:]}")
    return binary


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    """A child's pre-exec step that pins it to ``cpu`` (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def broker_forwarding_rate(
    sensors: int = 10_000, duration_s: float = CLOSED_LOOP_S
) -> dict[str, float]:
    """Messages per second the closed loop's load reaches the C subscriber through the broker."""
    cpus = sorted(os.sched_getaffinity(0))
    subscriber_cpu = cpus[0] if len(cpus) >= 2 else None
    if subscriber_cpu is not None:
        os.sched_setaffinity(0, set(cpus[1:]))  # this driver and the load generator
    try:
        with tempfile.TemporaryDirectory(prefix="tesla-bench-broker-") as temp:
            work = Path(temp)
            binary = build_subscriber(work)
            broker = Mosquitto(
                work / "broker", persistence=False, max_inflight_messages=1000, new_session=True
            )
            with broker:
                return _closed_loop(work, binary, broker, sensors, duration_s, subscriber_cpu)
    finally:
        if subscriber_cpu is not None:
            os.sched_setaffinity(0, set(cpus))


def _closed_loop(  # noqa: PLR0917 - one call site
    work: Path, binary: Path, broker: Mosquitto, sensors: int, duration_s: float, cpu: int | None
) -> dict[str, float]:
    status = work / "status.json"
    errors = work / "limit_sub.err"
    with errors.open("wb") as stderr:
        subscriber = subprocess.Popen(  # noqa: S603 - our own C client, no shell
            [str(binary), broker.host, str(broker.port), "limit-sub", _TOPIC, str(_UNBOUNDED),
             str(status)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            preexec_fn=_pinned(cpu),  # noqa: PLW1509 - only sched_setaffinity, no locks
        )  # fmt: skip
    try:
        assert subscriber.stdout is not None
        if subscriber.stdout.readline().strip() != b"subscribed":
            subscriber.wait(_STOP_WAIT_S)
            raise DevkitError(f"limit_sub did not subscribe: {errors.read_bytes()[-500:]!r}")
        loop = run_loadgen(
            "closedloop", work / "closed.json", port=broker.port, sensors=sensors,
            t0=int(time.time()) - 86_400, stride=1, batch=1, duration=duration_s,
            backlog=BACKLOG, status=status,
        )  # fmt: skip
        if subscriber.poll() is not None:
            raise DevkitError(f"limit_sub stopped: {errors.read_bytes()[-500:]!r}")
    finally:
        subscriber.terminate()
        try:
            subscriber.wait(_STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            subscriber.kill()
            subscriber.wait()
        if subscriber.stdout is not None:
            subscriber.stdout.close()
    return {
        "broker_messages": float(loop["readings_published"]),
        "broker_forward_s": duration_s,
        "broker_forward_per_s": ingest_rate(loop["samples"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sensors", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=CLOSED_LOOP_S)
    args = parser.parse_args(argv)
    print(json.dumps(broker_forwarding_rate(args.sensors, args.duration)))


if __name__ == "__main__":
    main()
