"""The wheel a Raspberry Pi user installs, as they would use it.

Built once per session from a copy of the checkout (devkit.wheel, as ``make wheel`` does), then
installed into a fresh venv with its runtime dependencies only (from a wheelhouse of their
wheels, filled once through pip's index). From that venv, run where no checkout is on the path:
``tesla-gateway init`` writes a configuration naming the bundled model, ``check-config`` accepts
it, and the daemon calibrates readings sent through a real mosquitto with that model. The
expected values come from LiteRT run by this test on the checkout's model file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from devkit.broker import Mosquitto
from devkit.daemon import GatewayDaemon
from devkit.wheel import REPO, install_into_venv
from tests.gateway.io.helpers import Collector
from tests.support.published import as_published

pytestmark = pytest.mark.slow

MODELS = REPO / "models"
BUNDLED = {"pm10-ispra-1min", "pm10-ispra-1min-rh-temp", "pm2_5-antwerp-1h"}
GATEWAY_ID = "gw-wheel"
SENSOR = "pi-node-1"
P = 60  # the bundled pm10 model's period ...
N = 360  # ... and window
PERIODS = N + 2  # three full windows
WAIT_S = 60.0  # upper bound on a wait (slow CI), never a timing assertion


@pytest.fixture(scope="module")
def wheel(gateway_wheel: Path) -> Path:
    return gateway_wheel


@pytest.fixture(scope="module")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The dev venv keeps the runtime dependencies' wheels: downloaded once, then offline.
    wheelhouse = Path(sys.prefix) / "wheelhouse"
    return install_into_venv(wheel, tmp_path_factory.mktemp("pi") / "venv", wheelhouse)


def clean_env() -> dict[str, str]:
    """The environment without the checkout on the path (a Pi has no checkout)."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def run(venv_python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_python.parent / "tesla-gateway"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=clean_env(),
    )


def python_says(venv_python: Path, code: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(venv_python), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        env=clean_env(),
    )
    return result.stdout.strip()


def test_wheel_holds_the_gateway_models_and_example_config_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    version = wheel.name.split("-")[1]
    assert tops == {"tesla_gateway", f"tesla_gateway-{version}.dist-info"}
    # Every module of the gateway (no subpackage forgotten by the package list).
    sources = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tesla_gateway").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert sources <= names
    # The default models, byte for byte, with their data attribution; the example config.
    for model in BUNDLED:
        for file in ("manifest.json", "model.tflite", "model_int8.tflite"):
            packaged = zipfile.ZipFile(wheel).read(f"tesla_gateway/default_models/{model}/{file}")
            assert packaged == (MODELS / model / file).read_bytes()
    attribution = (
        zipfile.ZipFile(wheel).read("tesla_gateway/default_models/ATTRIBUTION.md").decode()
    )
    assert "doi:10.5281/zenodo.7256405" in attribution
    example = zipfile.ZipFile(wheel).read("tesla_gateway/examples/gateway.example.toml")
    assert example == (REPO / "deploy" / "gateway.example.toml").read_bytes()
    # Not training, the devkit (demo, bench) or the tests; one command.
    assert not [n for n in names if {"demo", "training", "devkit", "tests"} & set(n.split("/"))]
    metadata = next(name for name in names if name.endswith("entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "tesla-gateway = tesla_gateway.daemon.cli:main" in entry_points
    assert "tesla-train" not in entry_points


def test_fresh_venv_has_the_runtime_dependencies_only(venv_python: Path, tmp_path: Path) -> None:
    found = python_says(
        venv_python,
        "import importlib.util as u, json, tesla_gateway\n"
        "names = ('tensorflow', 'keras', 'training', 'devkit', 'pandas', 'ai_edge_litert',\n"
        "         'gateway')\n"
        "found = {n: u.find_spec(n) is not None for n in names}\n"
        "print(json.dumps([tesla_gateway.__file__, found]))",
        cwd=tmp_path,
    )
    gateway_file, importable = json.loads(found)
    assert Path(gateway_file).is_relative_to(venv_python.parent.parent)  # not the checkout
    assert importable == {
        "tensorflow": False,
        "keras": False,
        "training": False,
        "devkit": False,
        "pandas": False,
        "ai_edge_litert": True,  # the runtime dependency that runs the model
        "gateway": False,  # the import package is the distribution's name, nothing else at the top
    }


def readings(base: int, values: np.ndarray) -> Iterator[bytes]:
    """JSON batches (a documented payload form) of one reading per period."""
    documents = [{"ts": base + i * P + 5, "pm10": float(v)} for i, v in enumerate(values)]
    for first in range(0, len(documents), 200):
        yield json.dumps(documents[first : first + 200]).encode()


def litert(model_dir: Path, windows: np.ndarray) -> np.ndarray:
    """The model file run by this test, one window per invoke."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model_dir / "model.tflite"))
    interpreter.allocate_tensors()
    source = interpreter.get_input_details()[0]["index"]
    target = interpreter.get_output_details()[0]["index"]
    out = []
    for window in windows.astype(np.float32):
        interpreter.set_tensor(source, window[np.newaxis, :])
        interpreter.invoke()
        out.append(float(interpreter.get_tensor(target).reshape(-1)[0]))
    return np.array(out)


def test_init_check_config_and_run_from_the_installed_wheel(
    venv_python: Path, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    init_args = ["init", "--out", str(config), "--gateway-id", GATEWAY_ID]
    init_args += ["--broker-port", str(mosquitto.port), "--sensor", SENSOR, "--state-dir", "state"]
    result = run(venv_python, *init_args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = config.read_text(encoding="utf-8")
    site = venv_python.parent.parent
    model_line = next(line for line in text.splitlines() if line.startswith("model_dir"))
    model_dir = Path(json.loads(model_line.split("=", 1)[1]))
    assert model_dir.is_relative_to(site)  # the bundled model, found in the installed package
    assert model_dir.name == "pm10-ispra-1min"
    assert text.lstrip().startswith("#")  # commented for the user

    checked = run(venv_python, "check-config", "--config", str(config), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "model pm10: pm10-ispra-1min" in checked.stdout

    rng = np.random.default_rng(5)
    # A walk reflected at 10 µg/m³: clipped, it sat at exactly 10 for 66 periods, a frozen
    # sensor whose value the gateway withholds (tesla_gateway/contract/stuck.py).
    walk = 40 + np.cumsum(rng.normal(0, 2.0, PERIODS))
    values = np.minimum(10 + np.abs(walk - 10), 120).round(2)
    # The default calibrates from the first period: a window not yet whole has the sensor's first
    # reading repeated before it (tesla_gateway.contract.series.pad_history).
    windows = [
        np.concatenate(
            [np.repeat(values[:1], max(0, N - end - 1)), values[max(0, end - N + 1) : end + 1]]
        )
        for end in range(PERIODS)
    ]
    expected = litert(MODELS / "pm10-ispra-1min", np.stack(windows))
    topic = f"tesla/{GATEWAY_ID}/{SENSOR}/pm10"
    collector = Collector(mosquitto, [topic])
    nodes = paho.Client(CallbackAPIVersion.VERSION2, client_id="wheel-node")
    nodes.connect(mosquitto.host, mosquitto.port)
    nodes.loop_start()
    # Fast ticks for the test, through the documented environment overrides.
    fast = {
        "PYTHONPATH": "",
        "TESLA_GATEWAY__TICK__GRACE_S": "0.5",
        "TESLA_GATEWAY__TICK__SETTLE_S": "0.1",
        "TESLA_GATEWAY__STATE__STATUS_INTERVAL_S": "0.1",
        "TESLA_GATEWAY__LOGGING__FORMAT": "json",
    }
    daemon = GatewayDaemon(
        config,
        tmp_path / "state",
        log=tmp_path / "daemon.log",
        env=fast,
        program=[str(venv_python.parent / "tesla-gateway")],
    )
    try:
        with daemon:
            daemon.wait_ready(WAIT_S)
            base = (int(time.time()) // P - PERIODS - 2) * P  # replayed, recent past
            for payload in readings(base, values):
                nodes.publish(f"sensors/{SENSOR}/raw", payload, qos=1).wait_for_publish(10)

            def calibrated() -> list[dict[str, Any]]:
                documents = [json.loads(payload) for payload in collector.on(topic)]
                return [d for d in documents if d["calibrated"] is not None]

            deadline = time.monotonic() + WAIT_S
            while len(calibrated()) < len(expected):
                daemon.check_alive()
                assert time.monotonic() < deadline, f"calibrations: {len(calibrated())}"
                time.sleep(0.05)
            got = calibrated()
            assert [d["model"] for d in got] == ["pm10-ispra-1min"] * len(expected)
            # Published to a tenth of a µg/m³ (docs/mqtt.md).
            assert [d["calibrated"] for d in got] == as_published(expected.tolist())
            assert [d["raw"] for d in got] == as_published(values.tolist())
            assert [d["history_periods"] for d in got] == [min(e + 1, N) for e in range(PERIODS)]
            status = run(venv_python, "status", "--config", str(config), cwd=tmp_path)
            assert status.returncode == 0, status.stdout + status.stderr
            assert f"gateway {GATEWAY_ID}" in status.stdout and "running, pid" in status.stdout
    finally:
        nodes.loop_stop()
        nodes.disconnect()
        collector.close()
    assert daemon.exit_code == 0, daemon.log_tail()
