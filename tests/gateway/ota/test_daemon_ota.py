"""The real daemon (``python -m tesla_gateway run``) with an ``[ota]`` section: one push updates the
gateway's own model (installed, hot-reloaded) and a node on its serial port (relayed, activated).

Real: the daemon process, mosquitto, the release tools, a pty as the node's USB serial port.
Virtual: the Arduino (tests/support/virtual_node.py), since no board exists here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from devkit.pty import PtySerial
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release
from tests.gateway.io.helpers import broker_config, collecting
from tests.gateway.ota.harness import make_node
from tests.support.releases import ReleaseKit
from training.release import push_release

WAIT_S = 60.0  # generous bound for slow machines; never a timing assertion


def _wait(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _config(tmp_path: Path, broker: Mosquitto, model_dir: Path, port: Path, key: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "gw-ota"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = 600
[state]
status_interval_s = 0.1
[logging]
format = "json"
[[sources]]
kind = "node"
port = "{port}"
reconnect_initial_s = 0.05
reconnect_max_s = 0.2
[publisher.broker]
port = {broker.port}
[ota]
public_key_file = "{key}"
ack_timeout_s = 1.0
""",
        encoding="utf-8",
    )
    return path


def test_one_push_updates_the_gateway_and_its_node(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial, tmp_path: Path
) -> None:
    model_dir = tmp_path / "pm10"
    # The daemon can write its OTA target, so it trusts it only through a signed release: the
    # first model is installed the same way as every later one.
    initial = release_kit.release(release_kit.base_version, "gateway")
    install_release(verify_release(initial, release_kit.public_key, None), model_dir, "pm10")
    new = release_kit.base_version + 7
    config = _config(tmp_path, mosquitto, model_dir, pty_serial.path, release_kit.keys.public_path)
    daemon = GatewayDaemon(config, tmp_path / "state", log=tmp_path / "daemon.log")
    status = daemon.status
    node = make_node(pty_serial, release_kit)

    with collecting(mosquitto, ["tesla/gw-ota/ota/#"]) as collector:
        daemon.start()
        node.start()
        try:
            _wait(lambda: status().get("phase") == "running", "the daemon to run")
            for target in ("gateway", "node"):
                push_release(release_kit.release(new, target), broker_config(mosquitto))
            _wait(
                lambda: status().get("models", {}).get("pm10", {}).get("version") == new,
                "the gateway to serve the new model",
            )
            _wait(lambda: node.active_version == new, "the node to activate the new model")
            _wait(
                lambda: any(
                    json.loads(p)["status"] == "active"
                    for p in collector.on("tesla/gw-ota/ota/node/node-7")
                ),
                "the node's 'active' status on MQTT",
            )
            gateway_status = [json.loads(p) for p in collector.on("tesla/gw-ota/ota/gateway")]
            assert gateway_status[-1]["status"] == "installed"
            assert daemon.stop(timeout_s=WAIT_S) == 0
        finally:
            node.stop()
            daemon.kill()
    assert [r for r in node.readings() if r.model_version == new and r.calibrated]
