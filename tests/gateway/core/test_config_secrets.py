"""No configuration or environment error echoes a value (issue 12, finding 10).

The real CLI in a subprocess, ``check-config`` and ``run``, each with a secret where the tester
put one: under misspelled password keys, under ``tls.key``, in a non-secret field (``port``),
in a custom validator's message, and through an environment variable with a misspelled name.
The secret must not appear on stdout or stderr (journald); the key at fault must.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SECRET = "Hunter2-s3cr3t-9d7e"
REPO = Path(__file__).resolve().parents[3]

BASE = """
gateway_id = "gw-secret"
state_dir = "{state}"
[[models]]
feature = "pm10"
model_dir = "{state}"
"""

# (case, extra TOML, environment, key the error must name)
CASES = [
    ("passwd", f'[publisher.broker]\nusername = "gw"\npasswd = "{SECRET}"\n', {}, "passwd"),
    ("pasword", f'[publisher.broker]\nusername = "gw"\npasword = "{SECRET}"\n', {}, "pasword"),
    ("pass", f'[publisher.broker]\nusername = "gw"\npass = "{SECRET}"\n', {}, "pass"),
    ("tls.key", f'[publisher.broker.tls]\nkey = "{SECRET}"\n', {}, "tls.key"),
    ("port", f'[publisher.broker]\nport = "{SECRET}"\n', {}, "port"),
    ("validator", f'[sensors]\nknown = ["{SECRET}!"]\n', {}, "sensors.known"),
    (
        "env",
        "",
        {"TESLA_GATEWAY__PUBLISHER__BROKER__PASWORD": SECRET},
        "TESLA_GATEWAY__PUBLISHER__BROKER__PASWORD",
    ),
]


@pytest.mark.parametrize("command", ["check-config", "run"])
@pytest.mark.parametrize(
    ("extra", "environ", "key"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_config_errors_never_echo_the_value(
    tmp_path: Path, command: str, extra: str, environ: dict[str, str], key: str
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(BASE.format(state=tmp_path) + extra, encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("TESLA_GATEWAY__")}
    result = subprocess.run(
        [sys.executable, "-m", "tesla_gateway", command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**clean, **environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "invalid configuration" in result.stderr
    assert key in result.stderr  # the error still says where the problem is
    assert SECRET not in output
    assert SECRET[:8] not in output  # not even part of it
