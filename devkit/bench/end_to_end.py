"""End to end: the real daemon between a private mosquitto, a load generator and a subscriber.

``python -m devkit.bench.end_to_end MODEL_DIR [--sensors 1000 10000]`` prints one JSON object
(the last line of its output). Everything talks over 127.0.0.1 only.

The set-up (one per sensor count S):

* **broker**: a private mosquitto on a free loopback port, ``set_tcp_nodelay true``;
* **daemon**: ``python -m tesla_gateway run --config X`` as a child process with a generated config
  (``tick.settle_s = 0.005``, ``num_threads = 1``, status.json every 0.25 s, window snapshots every
  600 s so that none falls in a measured phase) and its own temporary state dir, into which S
  sensors' windows are written *full* beforehand (N = 360 periods of plausible PM10, the state a
  daemon has after six hours of service): the windows are full from the first reading on, and
  every calibration is a real model invocation;
* **load generator** (``devkit.bench.loadgen``) and **subscriber**
  (``devkit.bench.e2e_subscriber``): separate processes.

With two or more CPUs the daemon is pinned to one CPU and everything else (broker, generator,
subscriber, this driver) to the others, so "per core" means one core.

Event time. Readings carry their own timestamps, 1 day in the past (within the source's default
``max_age_s``), on the model's grid of 60 s periods. A sensor's k-th reading has timestamp
``t0 + k * stride``.

Phases and figures:

1. **start-up** (``startup_s``, ``daemon_rss_mb_start``): a daemon with an empty state dir, from
   process start to status.json ``phase = running``; VmRSS then.
2. **latency** at S sensors × 1 reading per second: every sensor publishes one single-reading
   message per wall-clock second, sensor i at offset i/S of each second; the event clock runs at
   12 s per reading (``stride = 12``), so each 60 s period gets 5 readings and all S sensors cross
   a period boundary every 5 wall seconds, within the same second as real, unsynchronised sensors
   do once a minute. 16 rounds: 3 boundaries, 3·S calibrated messages. The latency of a
   calibrated message is its arrival at the subscriber minus the publication of the reading that
   closed its period (the sensor's first reading of the next period: a period closes in event
   time when that reading arrives). Over this phase: daemon CPU seconds (utime + stime of all its
   threads, /proc/<pid>/stat) per 1,000 calibrations (including the ingest of the 5 readings per
   calibration), CPU seconds per wall second, and VmRSS / VmHWM with S windows full (and
   ``daemon_rss_mb_after_load_S`` after phase 4, when every open period holds up to 60 readings).
3. **throughput** (``e2e_readings_per_s_S``): a closed loop: the generator publishes as fast as
   the daemon ingests, never more than 10,000 readings ahead of status.json ``readings_in``; the
   rate is the slope of ``readings_in`` over the phase after a 1 s warm-up. Stride 1 s (60
   readings per period, as at one reading per second), so period closes, calibrations and
   publishes are part of the work. Once with one reading per message, once with 10 consecutive
   readings per message (``e2e_batched_readings_per_s_S``; a node that buffers).
4. **confirmation** (``e2e_paced_*``): an open loop at 90 % of the closed-loop rate for 6 s:
   whether the daemon keeps up (everything ingested within 1 s of the end, backlog not growing).
5. **latency with the batch topic** (``*_batch_topic_S``): the daemon restarted on the same
   windows with ``publisher.per_sensor_topics = false, batch_topic = true`` (each tick's readings
   as arrays on ``<prefix>/_batch/pm10``, docs/mqtt.md), and phase 2 again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.mqtt.config import ClientKind, IoLoop
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import NO_PERIOD, WindowState

__all__ = ["run_end_to_end"]

GATEWAY_ID = "bench"
LATENCY_STRIDE_S = 12
LATENCY_BOUNDARIES = 3
CLOSED_LOOP_S = 8.0
BATCHED_S = 6.0
PACED_S = 6.0
PACED_FRACTION = 0.9
BACKLOG = 10_000
BATCH = 10
_WAIT_S = 60.0


def _config_text(
    state_dir: Path,
    model_dir: Path,
    port: int,
    *,
    batch_topic: bool = False,
    io_loop: IoLoop = "thread",
    client: ClientKind = "fast",
) -> str:
    output = "per_sensor_topics = false\nbatch_topic = true\n" if batch_topic else ""
    network = "" if io_loop == "thread" else f'io_loop = "{io_loop}"\n'
    if client != "fast":
        network += f'client = "{client}"\n'
    return f"""# Generated by devkit/bench/end_to_end.py for one benchmark run.
gateway_id = "{GATEWAY_ID}"
state_dir = {json.dumps(str(state_dir))}

[[models]]
feature = "pm10"
model_dir = {json.dumps(str(model_dir))}

[runtime]
num_threads = 1
model_poll_s = 600

[tick]
grace_s = 5.0
settle_s = 0.005

[state]
status_interval_s = 0.25
save_interval_s = 600

[logging]
format = "json"
level = "info"

[publisher]
stats_interval_s = 60
# The restored windows' newest readings are a day old in event time, and a restored sensor's
# idleness is judged by event time (snapshots do not keep arrival times: a known limit, see
# tesla_gateway/ingest/admission.py adopt_windows), so every sensor would "come online"
# (10,000 retained availability messages) inside the first measured phase; a gateway in steady
# state has them online already. Two days keeps them online.
sensor_offline_after_s = 172800
{output}[publisher.broker]
port = {port}
{network}
[[sources]]
kind = "mqtt"
topics = ["sensors/+/raw"]
[sources.broker]
port = {port}
{network}"""


def _prefill(state_dir: Path, model_dir: Path, sensors: int, first_period: int) -> None:
    """Windows of ``sensors`` sensors, full up to ``first_period - 1``, as the daemon saves them."""
    geometry = WindowGeometry.from_manifest(load_manifest(model_dir))
    n, c = geometry.window_length, len(geometry.channels)
    rng = np.random.default_rng(sensors)
    level = rng.gamma(2.0, 12.0, size=(sensors, c, 1)) + 2.0
    ring = (level * rng.lognormal(0.0, 0.08, size=(sensors, c, n))).astype(np.float32)
    last = first_period - 1
    state = WindowState(
        geometry=geometry,
        sensor_ids=[f"node-{i:05d}" for i in range(sensors)],
        ring=ring,
        last_closed=np.full(sensors, last, dtype=np.int64),
        first_period=np.full(sensors, last - 2 * n, dtype=np.int64),
        last_obs_period=np.full((sensors, c), last, dtype=np.int64),
        last_obs_value=ring[:, :, last % n].astype(np.float64),
        open_period=np.full(sensors, NO_PERIOD, dtype=np.int64),
        open_sum=np.zeros((sensors, c)),
        open_count=np.zeros((sensors, c), dtype=np.int64),
        open_seen=[[] for _ in range(sensors)],
        pending_period=np.full(sensors, NO_PERIOD, dtype=np.int64),
    )
    if not StateStore(state_dir).write("pm10", state):
        raise RuntimeError(f"cannot write the prefilled windows under {state_dir}")


def _start_daemon(config: Path, state_dir: Path, cpu: int | None) -> GatewayDaemon:
    return GatewayDaemon(config, state_dir, cpu=cpu).start()


def _mib(daemon: GatewayDaemon, key: str) -> float:
    """A /proc/<pid>/status field (VmRSS, VmHWM) in MiB."""
    return daemon.proc_status_kib(key) / 1024


@contextmanager
def _subscriber(port: int, out: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(  # noqa: S603 - our own module, no shell
        [
            sys.executable,
            "-m",
            "devkit.bench.e2e_subscriber",
            "--port",
            str(port),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the benchmark subscriber did not start")
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_loadgen(mode: str, out: Path, **options: object) -> dict[str, Any]:
    argv = [sys.executable, "-m", "devkit.bench.loadgen", mode, "--out", str(out)]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    subprocess.run(argv, check=True, timeout=300)  # noqa: S603 - our own module, no shell
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def ingest_rate(samples: list[list[float]], warmup_s: float = 1.0) -> float:
    """Slope of ``ingested`` over the samples after ``warmup_s`` (readings per second)."""
    if len(samples) < 3:
        return float("nan")
    t0 = samples[0][0] + warmup_s
    kept = [s for s in samples if s[0] >= t0] or samples
    first, last = kept[0], samples[-1]
    if last[0] <= first[0]:
        return float("nan")
    return (last[2] - first[2]) / (last[0] - first[0])


def _percentiles(latencies: np.ndarray) -> dict[str, float]:
    if latencies.size == 0:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ms = latencies * 1000.0
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
    }


def _latencies(boundaries: list[dict[str, Any]], rows: list[list[Any]]) -> tuple[np.ndarray, int]:
    arrivals: dict[tuple[int, int], float] = {}
    for arrival, sensor, period, _calibrated in rows:
        key = (int(sensor), int(period))
        arrivals[key] = min(arrival, arrivals.get(key, arrival))
    values: list[float] = []
    missing = 0
    for boundary in boundaries:
        period = int(boundary["closed_period"])
        for sensor, published in enumerate(boundary["published"]):
            arrival = arrivals.get((sensor, period))
            if arrival is None:
                missing += 1
            else:
                values.append(arrival - published)
    return np.array(values), missing


def _next_boundary_start(t: int, period: int, before_s: int) -> int:
    """An event time ``before_s`` seconds before the next period boundary, not before ``t``."""
    boundary = (t // period + 1) * period
    return max(t, boundary - before_s)


@dataclass
class _Run:
    """One scenario's fixed parts."""

    work: Path
    port: int
    sensors: int
    period: int
    daemon: GatewayDaemon

    def loadgen(self, mode: str, name: str, **options: object) -> dict[str, Any]:
        return run_loadgen(
            mode, self.work / f"{name}-{self.sensors}.json", port=self.port, sensors=self.sensors,
            **options,
        )  # fmt: skip

    @property
    def status_file(self) -> Path:
        return self.daemon.state_dir / "status.json"


def _latency_phase(run: _Run, t0: int, suffix: str = "") -> tuple[dict[str, float], dict[str, Any]]:
    """S sensors x 1 reading per wall-clock second across LATENCY_BOUNDARIES period closes."""
    daemon, s = run.daemon, f"{suffix}{run.sensors}"
    status0 = daemon.status()
    cpu0, wall0 = daemon.cpu_s(), time.monotonic()
    rounds = LATENCY_BOUNDARIES * run.period // LATENCY_STRIDE_S + 1
    latency = run.loadgen(
        "realtime", f"latency{suffix}", t0=t0, stride=LATENCY_STRIDE_S, rounds=rounds,
        period=run.period,
    )  # fmt: skip
    expected = status0["ticker"]["published"] + LATENCY_BOUNDARIES * run.sensors
    status1 = daemon.wait_status(
        lambda st: (
            st["ticker"]["published"] >= expected and st.get("publisher", {}).get("queued", 1) == 0
        )
    )
    cpu1, wall1 = daemon.cpu_s(), time.monotonic()
    calibrations = status1["ticker"]["calibrated"] - status0["ticker"]["calibrated"]
    figures = {
        f"e2e_calibrations_latency_phase_{s}": float(calibrations),
        f"cpu_s_per_1000_calibrations_{s}": (
            1000 * (cpu1 - cpu0) / calibrations if calibrations else float("nan")
        ),
        f"daemon_cpu_fraction_realtime_{s}": (cpu1 - cpu0) / (wall1 - wall0),
        f"daemon_rss_mb_{s}": _mib(daemon, "VmRSS"),
        f"daemon_peak_rss_mb_{s}": _mib(daemon, "VmHWM"),
    }
    return figures, latency


def _closed_loop_phase(
    run: _Run, t: int, batch: int, duration: float
) -> tuple[dict[str, float], int]:
    """The generator as fast as the daemon ingests; returns figures and the next event time."""
    daemon, s = run.daemon, run.sensors
    name = "batched_" if batch > 1 else ""
    t = _next_boundary_start(t, run.period, 3)
    before = daemon.status()
    cpu0 = daemon.cpu_s()
    loop = run.loadgen(
        "closedloop", f"closed-{name}", t0=t, stride=1, batch=batch, duration=duration,
        backlog=BACKLOG, status=run.status_file,
    )  # fmt: skip
    target = before["readings_in"] + loop["readings_published"]
    after = daemon.wait_status(lambda st: st["readings_in"] >= target, timeout_s=_WAIT_S)
    cpu1 = daemon.cpu_s()
    readings = max(1, after["readings_in"] - before["readings_in"])
    figures = {
        f"e2e_{name}readings_per_s_{s}": ingest_rate(loop["samples"]),
        f"e2e_{name}cpu_us_per_reading_{s}": 1e6 * (cpu1 - cpu0) / readings,
        f"e2e_{name}calibrations_in_phase_{s}": float(
            after["ticker"]["calibrated"] - before["ticker"]["calibrated"]
        ),
    }
    return figures, int(loop["next_t0"])


def _paced_phase(run: _Run, t: int, rate: float) -> tuple[dict[str, float], int]:
    """Open loop at ``rate``: does the daemon keep up, without a growing backlog?"""
    s = run.sensors
    paced = run.loadgen(
        "paced", "paced", t0=t, stride=1, rate=round(rate), duration=PACED_S,
        status=run.status_file,
    )  # fmt: skip
    samples = paced["samples"]
    published = paced["readings_published"]
    final_lag = published - samples[-1][2] if samples else published
    lags = [p - i for _, p, i in samples]
    half = len(lags) // 2
    growing = bool(lags) and max(lags[half:], default=0) > 2 * max(
        max(lags[:half], default=0), rate * 0.25
    )
    figures = {
        f"e2e_paced_offered_per_s_{s}": rate,
        f"e2e_paced_max_backlog_{s}": float(max(lags, default=0)),
        f"e2e_paced_kept_up_{s}": float(final_lag == 0 and not growing),
    }
    return figures, int(paced["next_t0"])


def _scenario(  # noqa: PLR0917 - one call site, all needed
    work: Path,
    model_dir: Path,
    port: int,
    sensors: int,
    daemon_cpu: int | None,
    batch_topic: bool,
    io_loop: IoLoop,
    client: ClientKind = "fast",
) -> dict[str, float]:
    period = load_manifest(model_dir).period_seconds
    state_dir = work / f"state-{sensors}"
    first_period = (int(time.time()) - 86_400) // period
    _prefill(state_dir, model_dir, sensors, first_period)
    config = work / f"gateway-{sensors}.toml"
    config.write_text(
        _config_text(state_dir, model_dir, port, io_loop=io_loop, client=client), encoding="utf-8"
    )
    s = sensors
    figures: dict[str, float] = {}
    with _subscriber(port, work / f"received-{s}.json"):
        daemon = _start_daemon(config, state_dir, daemon_cpu)
        try:
            figures[f"startup_restore_s_{s}"] = daemon.wait_ready(_WAIT_S, poll_s=0.005)
            run = _Run(work, port, s, period, daemon)
            phase, latency = _latency_phase(run, first_period * period)
            figures.update(phase)
            t = int(latency["next_t0"])
            phase, t = _closed_loop_phase(run, t, 1, CLOSED_LOOP_S)
            figures.update(phase)
            phase, t = _closed_loop_phase(run, t, BATCH, BATCHED_S)
            figures.update(phase)
            rate = PACED_FRACTION * figures[f"e2e_readings_per_s_{s}"]
            if np.isfinite(rate) and rate > 0:
                phase, t = _paced_phase(run, t, rate)
                figures.update(phase)
            # After the load phases: open periods hold up to 60 readings each (stride 1 s).
            figures[f"daemon_rss_mb_after_load_{s}"] = _mib(daemon, "VmRSS")
        finally:
            daemon.stop()
        phases = {"": latency}
        if batch_topic:
            # The same windows (saved at the stop), published as arrays on <prefix>/_batch/pm10.
            config.write_text(
                _config_text(
                    state_dir, model_dir, port, batch_topic=True, io_loop=io_loop, client=client
                ),
                encoding="utf-8",
            )
            daemon = _start_daemon(config, state_dir, daemon_cpu)
            try:
                daemon.wait_ready(_WAIT_S, poll_s=0.005)
                run = _Run(work, port, s, period, daemon)
                phase, phases["batch_topic_"] = _latency_phase(run, t, "batch_topic_")
                figures.update(phase)
            finally:
                daemon.stop()
    return _latency_figures(figures, s, work, phases)  # the subscriber has written its file


def _latency_figures(
    figures: dict[str, float], s: int, work: Path, phases: dict[str, dict[str, Any]]
) -> dict[str, float]:
    rows = json.loads((work / f"received-{s}.json").read_text(encoding="utf-8"))
    for name, generated in phases.items():
        values, missing = _latencies(generated["boundaries"], rows)
        for key, value in _percentiles(values).items():
            figures[f"e2e_latency_{key}_ms_{name}{s}"] = value
        figures[f"e2e_latency_samples_{name}{s}"] = float(values.size)
        figures[f"e2e_latency_missing_{name}{s}"] = float(missing)
    return figures


def run_end_to_end(
    model_dir: Path,
    sensor_counts: tuple[int, ...],
    *,
    batch_topic: bool = True,
    io_loop: IoLoop = "thread",
    client: ClientKind = "fast",
) -> dict[str, float]:
    """All phases for each sensor count; figures by name (see the module docstring)."""
    cpus = sorted(os.sched_getaffinity(0))
    daemon_cpu: int | None = None
    if len(cpus) >= 2:
        daemon_cpu = cpus[0]
        os.sched_setaffinity(0, set(cpus[1:]))  # this driver and every child but the daemon
    figures: dict[str, float] = {"load_average_1min_before": os.getloadavg()[0]}
    model_dir = model_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="tesla-bench-e2e-") as temp:
        work = Path(temp)
        broker = Mosquitto(
            work / "broker", persistence=False, max_inflight_messages=1000, new_session=True
        )
        with broker:
            fresh_state = work / "state-fresh"
            config = work / "gateway-fresh.toml"
            config.write_text(
                _config_text(fresh_state, model_dir, broker.port, io_loop=io_loop, client=client),
                encoding="utf-8",
            )
            daemon = _start_daemon(config, fresh_state, daemon_cpu)
            try:
                figures["startup_s"] = daemon.wait_ready(_WAIT_S, poll_s=0.005)
                time.sleep(0.5)
                figures["daemon_rss_mb_start"] = _mib(daemon, "VmRSS")
            finally:
                daemon.stop()
            for sensors in sensor_counts:
                figures.update(
                    _scenario(
                        work,
                        model_dir,
                        broker.port,
                        sensors,
                        daemon_cpu,
                        batch_topic,
                        io_loop,
                        client,
                    )
                )
    if sensor_counts:
        figures["cpu_s_per_1000_calibrations"] = figures[
            f"cpu_s_per_1000_calibrations_{max(sensor_counts)}"
        ]
    figures["load_average_1min_after"] = os.getloadavg()[0]
    figures["daemon_pinned_to_one_cpu"] = float(daemon_cpu is not None)
    with suppress(OSError):
        os.sched_setaffinity(0, set(cpus))
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.bench.end_to_end", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--sensors", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--no-batch-topic",
        action="store_true",
        help="skip phase 5 (to measure a gateway version without publisher.batch_topic)",
    )
    parser.add_argument(
        "--io-loop",
        choices=["thread", "event_loop"],
        default="thread",
        help="the daemon's MQTT network loop (MqttBrokerConfig.io_loop)",
    )
    parser.add_argument(
        "--client",
        choices=["fast", "plain"],
        default="fast",
        help="the daemon's MQTT client (MqttBrokerConfig.client)",
    )
    args = parser.parse_args(argv)
    figures = run_end_to_end(
        args.model,
        tuple(args.sensors),
        batch_topic=not args.no_batch_topic,
        io_loop=args.io_loop,
        client=args.client,
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
