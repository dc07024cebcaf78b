"""The physical limit of the end-to-end figures: what the broker itself delivers per second.

``python -m devkit.bench.broker_limit [--sensors S] [--duration SECONDS]`` prints one JSON object.

The daemon is an MQTT subscriber that does work per message; the fastest possible subscriber does
next to none. This runs the end-to-end bench's closed loop (the same private mosquitto: no
persistence, ``max_inflight_messages 1000``, TCP_NODELAY; one-reading QoS 1 messages on
S = 10,000 sensor topics, 500 per write, never more than 10,000 ahead of what the consumer has
taken; the rate is the slope of the consumer's count after a 1 s warm-up) with the daemon
replaced by ``limit_sub.c``: a QoS 1 subscriber to the daemon's subscription that reads 1 MiB at
a time, acknowledges every message of a read in one write and reports its count in a status file
as the daemon's status.json does. It is pinned to the CPU the daemon is pinned to there,
everything else to the others. Both C programs are built here with the system ``cc``.

Two publishers, two figures:

* ``broker_forward_per_s``, the limit: ``limit_pub.c``, the same load written in C (the same
  topics, payload form, chunking and backlog rule), so that the broker has the core it shares
  with the publisher nearly to itself. C publisher to C subscriber: what this broker forwards.
* ``broker_forward_loadgen_per_s``: the bench's own Python generator
  (``devkit.bench.loadgen closedloop``, about 3 µs per message on the broker's core) in place of
  the C publisher: the same loop the daemon is measured in, with nothing but the consumer
  changed.

``fraction_of_broker_S`` in ``make bench`` is the daemon's closed-loop rate over the limit.
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
from typing import Any

from devkit.bench.end_to_end import BACKLOG, CLOSED_LOOP_S, ingest_rate, run_loadgen
from devkit.broker import Mosquitto
from devkit.errors import DevkitError

__all__ = ["CompilerMissingError", "broker_forwarding_rate", "build_publisher", "build_subscriber"]

_HERE = Path(__file__).parent
_TOPIC = "sensors/+/raw"  # the daemon's subscription in the end-to-end bench
_UNBOUNDED = 10**15  # the subscriber's COUNT when the load generator decides the end
_STOP_WAIT_S = 10.0


class CompilerMissingError(DevkitError):
    """No C compiler to build the bench's subscriber (Debian package gcc)."""


def build_subscriber(directory: Path) -> Path:
    """``limit_sub.c`` compiled into ``directory`` (a fraction of a second with -O2)."""
    return _build("limit_sub", directory)


def build_publisher(directory: Path) -> Path:
    """``limit_pub.c`` compiled into ``directory``."""
    return _build("limit_pub", directory)


def _build(name: str, directory: Path) -> Path:
    source = _HERE / f"{name}.c"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CompilerMissingError(
            f"no C compiler (cc) to build devkit/bench/{source.name}: install the Debian package "
            "gcc (scripts/install-system-deps.sh does)"
        )
    binary = directory / name
    built = subprocess.run(  # noqa: S603 - the system compiler on our own source, no shell
        [compiler, "-O2", "-Wall", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise DevkitError(f"cannot build {source.name}: {built.stderr.strip()[-500:]}")
    return binary


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    """A child's pre-exec step that pins it to ``cpu`` (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def broker_forwarding_rate(
    sensors: int = 10_000, duration_s: float = CLOSED_LOOP_S
) -> dict[str, float]:
    """Messages per second through the broker to the C subscriber, from each publisher."""
    cpus = sorted(os.sched_getaffinity(0))
    subscriber_cpu = cpus[0] if len(cpus) >= 2 else None
    if subscriber_cpu is not None:
        os.sched_setaffinity(0, set(cpus[1:]))  # this driver and the publishers
    try:
        with tempfile.TemporaryDirectory(prefix="tesla-bench-broker-") as temp:
            work = Path(temp)
            subscriber = build_subscriber(work)
            publisher = build_publisher(work)

            def c_publisher(port: int, status: Path) -> dict[str, Any]:
                return _run_c_publisher(publisher, work, port, sensors, duration_s, status)

            def load_generator(port: int, status: Path) -> dict[str, Any]:
                return run_loadgen(
                    "closedloop", work / "closed.json", port=port, sensors=sensors,
                    t0=int(time.time()) - 86_400, stride=1, batch=1, duration=duration_s,
                    backlog=BACKLOG, status=status,
                )  # fmt: skip

            limit = _closed_loop(work / "c", subscriber, c_publisher, subscriber_cpu)
            loadgen = _closed_loop(work / "loadgen", subscriber, load_generator, subscriber_cpu)
    finally:
        if subscriber_cpu is not None:
            os.sched_setaffinity(0, set(cpus))
    return {
        "broker_messages": float(limit["readings_published"]),
        "broker_forward_s": duration_s,
        "broker_forward_per_s": ingest_rate(limit["samples"]),
        "broker_forward_loadgen_per_s": ingest_rate(loadgen["samples"]),
    }


def _run_c_publisher(  # noqa: PLR0917 - one call site
    binary: Path, work: Path, port: int, sensors: int, duration_s: float, status: Path
) -> dict[str, Any]:
    out = work / "limit_pub.json"
    ran = subprocess.run(  # noqa: S603 - our own C client, no shell
        [str(binary), "127.0.0.1", str(port), "limit-pub", str(sensors), str(duration_s),
         str(BACKLOG), str(status), str(out)],
        capture_output=True, text=True, check=False, timeout=duration_s + 120,
    )  # fmt: skip
    if ran.returncode != 0:
        raise DevkitError(f"limit_pub failed: {ran.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def _closed_loop(
    work: Path, binary: Path, publish: Callable[[int, Path], dict[str, Any]], cpu: int | None
) -> dict[str, Any]:
    """One closed loop on a fresh broker: ``publish(port, status_file)`` drives the subscriber."""
    work.mkdir()
    status = work / "status.json"
    errors = work / "limit_sub.err"
    broker = Mosquitto(
        work / "broker", persistence=False, max_inflight_messages=1000, new_session=True
    )
    with broker, errors.open("wb") as stderr:
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
            loop = publish(broker.port, status)
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
    return loop


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sensors", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=CLOSED_LOOP_S)
    args = parser.parse_args(argv)
    print(json.dumps(broker_forwarding_rate(args.sensors, args.duration)))


if __name__ == "__main__":
    main()
