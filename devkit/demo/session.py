"""One demo run: broker, daemon, nodes, live view, then the summary; everything started is stopped.

Start-up and shutdown are synchronous and owned by one ``ExitStack`` (so Ctrl-C at any moment
unwinds them in reverse order: nodes, daemon, pty, broker); the replay itself runs in asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from devkit.broker import MOSQUITTO, Mosquitto
from devkit.daemon import GatewayDaemon
from devkit.demo import DemoError
from devkit.demo.gateway_config import GATEWAY_ID, DemoGatewayConfig, write_gateway_config
from devkit.demo.nodes import MqttNode, ReplayClock, SerialNode
from devkit.demo.replay_slice import DemoSlice, load_slice
from devkit.demo.report import summary_table, write_plot, write_traces
from devkit.demo.scoreboard import Scoreboard
from devkit.demo.view import LiveView, format_time
from devkit.errors import DevkitError
from devkit.log_capture import logging_to
from devkit.pty import PtySerial
from tesla_gateway.contract.manifest import Manifest, load_manifest
from tesla_gateway.errors import GatewayError
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttError
from tesla_gateway.mqtt.inbox import InboundMessage

__all__ = ["DemoOptions", "DemoOutcome", "run_demo"]

_READY_TIMEOUT_S = 60.0
_DRAIN_TIMEOUT_S = 20.0  # after the replay: the last periods close (grace_s) and come back
_SERIAL_SENSORS = 1

Node = MqttNode | SerialNode


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``python -m devkit.demo`` was asked to do."""

    data: Path
    model_dir: Path
    out_dir: Path
    seconds: float
    speed: float | None  # history seconds per wall second; None: fit the slice into ``seconds``
    tty: bool
    mosquitto: Path = MOSQUITTO
    # Served beside model_dir: the nodes with a humidity sensor get it
    # (tesla_gateway.models.choice).
    covariate_model_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class DemoOutcome:
    """What the run produced (for the caller's exit code and for tests)."""

    scoreboard: Scoreboard
    summary: str
    plot: Path | None
    traces: Path
    daemon_exit_code: int | None


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> DemoOutcome:
    demo_slice = load_slice(options.data)
    manifest = _load_model(options.model_dir)
    span = demo_slice.end - demo_slice.start + manifest.period_seconds
    speed = options.speed if options.speed is not None else span / options.seconds
    wall_seconds = min(options.seconds, span / speed)
    if wall_seconds * speed < manifest.calibrates_from * manifest.period_seconds:
        out.write(
            f"note: {wall_seconds:.0f} s at {speed:.0f}x replays less than the "
            f"{manifest.calibrates_from} periods the model calibrates from: nothing will be "
            "calibrated\n"
        )
    options.out_dir.mkdir(parents=True, exist_ok=True)
    daemon_log = options.out_dir / "gateway.log"
    daemon_log.unlink(missing_ok=True)
    sensors = demo_slice.sensor_ids
    serial_ids = set(sensors[-_SERIAL_SENSORS:])
    links = {s: ("serial" if s in serial_ids else "mqtt") for s in sensors}
    roles = _roles(manifest)
    covariate = (
        None if options.covariate_model_dir is None else _load_model(options.covariate_model_dir)
    )
    # Without a humidity sensor: the first training box, so both models are seen at work.
    training = [s for s in sensors if roles.get(s) == "training box"]
    pm_only = {(training or list(sensors))[0]} if covariate else set()
    models_line = (
        ""
        if covariate is None
        else f"and {covariate.name} v{covariate.version} (PM10, rh, temp_c) for the nodes that "
        f"report humidity (all but {', '.join(sorted(pm_only))}) "
    )
    header = (
        f"TESLA gateway demo: model {manifest.name} v{manifest.version} "
        f"(N={manifest.window_length}) {models_line}in the real daemon\n"
        f"replaying Ispra PM10 {format_time(demo_slice.start)} to {format_time(demo_slice.end)} "
        f"at {speed:.0f}x ({speed / 60:.1f} min of history per second)"
    )
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tesla-demo-")))
        log_stream = stack.enter_context((options.out_dir / "demo.log").open("w", encoding="utf-8"))
        stack.enter_context(logging_to(log_stream))
        out.write(f"{header}\nstarting a private mosquitto ...\n")
        out.flush()
        broker = stack.enter_context(
            Mosquitto(
                work / "mosquitto",
                executable=options.mosquitto,
                persistence=False,
                max_inflight_messages=1000,
                new_session=True,  # Ctrl-C reaches the demo, which stops the broker in order
            )
        )
        ptys = [
            stack.enter_context(
                contextlib.closing(PtySerial(work / f"ttyNODE{i}", nonblocking=True))
            )
            for i in range(len(serial_ids))
        ]
        config_path = write_gateway_config(
            DemoGatewayConfig(
                work_dir=work,
                broker_port=broker.port,
                model_dir=options.model_dir.resolve(),
                serial_ports=tuple(p.path for p in ptys),
                oldest_reading=demo_slice.start,
                covariate_model_dir=None
                if options.covariate_model_dir is None
                else options.covariate_model_dir.resolve(),
            ),
            now=time.time(),
        )
        out.write(
            f"starting the gateway daemon (python -m tesla_gateway run; log {daemon_log}) ...\n"
            "(the nodes replay 2020 with their own timestamps, so this run's gateway.toml accepts "
            "old readings: max_age_s, max_backlog_s; a deployment keeps the defaults)\n"
        )
        out.flush()
        daemon = stack.enter_context(
            GatewayDaemon(config_path, work / "state", log=daemon_log, new_session=True)
        )
        daemon.wait_ready(_READY_TIMEOUT_S)
        broker_config = MqttBrokerConfig(host=broker.host, port=broker.port)
        pty_iter = iter(ptys)
        nodes: list[Node] = [
            SerialNode(s, next(pty_iter))
            if links[s] == "serial"
            else MqttNode(
                s, broker_config, iso_timestamps=index % 2 == 1, covariates=s not in pm_only
            )
            for index, s in enumerate(sensors)
        ]
        board = Scoreboard(demo_slice, links)
        asyncio.run(
            _replay(
                nodes,
                demo_slice=demo_slice,
                board=board,
                broker=broker_config,
                daemon=daemon,
                settings=LiveSettings(out, options.tty, header, speed, wall_seconds, manifest),
            )
        )
        exit_code = daemon.stop()
        if exit_code != 0:
            raise DemoError(
                f"the gateway daemon exited with code {exit_code} at shutdown; end of its log "
                f"({daemon_log}):\n{daemon.log_tail()}"
            )
    summary = summary_table(board, roles)
    traces = write_traces(board, options.out_dir / "demo-traces.csv")
    served = [f"{manifest.name} v{manifest.version} (PM10 only)"] + (
        [] if covariate is None else [f"{covariate.name} v{covariate.version} (PM10, rh, temp_c)"]
    )
    title = (
        f"The gateway daemon on the replayed Ispra demo slice (N={manifest.window_length}, "
        f"calibrated from period {manifest.calibrates_from})\nmodels: {' and '.join(served)}"
    )
    plot = write_plot(
        board,
        demo_slice,
        options.out_dir / "demo-traces.png",
        roles,
        title=title,
        window_length=manifest.window_length,
    )
    return DemoOutcome(board, summary, plot, traces, exit_code)


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """How the live part shows itself."""

    out: TextIO
    tty: bool
    header: str
    speed: float
    wall_seconds: float
    manifest: Manifest


async def _replay(
    nodes: list[Node],
    *,
    demo_slice: DemoSlice,
    board: Scoreboard,
    broker: MqttBrokerConfig,
    daemon: GatewayDaemon,
    settings: LiveSettings,
) -> None:
    async def on_message(message: InboundMessage) -> None:
        board.on_message(message.topic, message.payload)

    view_connection = MqttConnection(
        broker, client_id="demo-view", clean_start=True, on_message=on_message, name="view"
    )
    with _as_demo_error():
        async with view_connection:
            await asyncio.wait_for(view_connection.wait_connected(), 10.0)
            await view_connection.subscribe([f"tesla/{GATEWAY_ID}/+/pm10"], qos=1)
            for node in nodes:
                if isinstance(node, SerialNode):
                    await node.wait_asked(_READY_TIMEOUT_S)
            clock = ReplayClock(
                history_start=demo_slice.start,
                speed=settings.speed,
                wall_start=time.monotonic() + 0.2,
                wall_seconds=settings.wall_seconds,
            )
            view = LiveView(
                board,
                clock,
                settings.out,
                tty=settings.tty,
                header=settings.header,
                history_end=demo_slice.end,
                window_length=settings.manifest.window_length,
                calibrates_from=settings.manifest.calibrates_from,
                check=daemon.check_alive,
            )
            async with asyncio.TaskGroup() as group:
                view_task = group.create_task(view.run(), name="view")
                replays = [
                    group.create_task(
                        node.replay(demo_slice.rows[node.sensor_id], clock, board.on_sent),
                        name=f"node-{node.sensor_id}",
                    )
                    for node in nodes
                ]
                await asyncio.wait(replays)
                await _until(lambda: board.complete, daemon, _DRAIN_TIMEOUT_S)
                view_task.cancel()
            # The daemon's clean shutdown runs a final tick and flushes its outbox: keep
            # listening until it has exited.
            await asyncio.to_thread(daemon.stop)
            await _until(lambda: board.complete, None, 2.0)
            settings.out.write(view.final_frame() + "\n\n")
            settings.out.flush()


async def _until(
    condition: Callable[[], bool], daemon: GatewayDaemon | None, timeout_s: float
) -> None:
    """Poll ``condition`` (bounded), failing early if the daemon died."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        if daemon is not None:
            daemon.check_alive()
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def _as_demo_error() -> Iterator[None]:
    """Unwrap the TaskGroup's exception group into the first error the user can act on."""
    try:
        yield
    except* DevkitError as group:  # DemoError, or the daemon exited
        raise group.exceptions[0] from None
    except* (MqttError, TimeoutError) as group:
        raise DemoError(f"the demo's MQTT clients failed: {group.exceptions[0]}") from None


def _load_model(model_dir: Path) -> Manifest:
    try:
        manifest = load_manifest(model_dir)
    except GatewayError as exc:
        raise DemoError(
            f"cannot use the model in {model_dir}: {exc} (the default model is committed in "
            "models/; `make models` retrains it)"
        ) from exc
    if manifest.feature != "pm10":
        raise DemoError(f"the demo replays PM10; {model_dir} calibrates {manifest.feature}")
    return manifest


def _roles(manifest: Manifest) -> dict[str, str]:
    data = manifest.data
    roles = dict.fromkeys(data.train_sensors, "training box")
    roles[data.validation_sensor] = "validation box"
    roles[data.test_sensor] = "test box (unseen)"
    return roles
