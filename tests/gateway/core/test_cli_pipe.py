"""``tesla-gateway status | head -1`` ends quietly: no traceback when the reader leaves early.

Before, the output was written when the interpreter flushed stdout at exit: with the reader gone
that printed ``Exception ignored ... BrokenPipeError`` on stderr and exited 120; a status larger
than the pipe's buffer died on a traceback mid-print. Real pipes, real subprocesses: a pipe
whose reader is closed before the command writes, and ``head -1`` in a shell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

CONFIG = """
gateway_id = "gw-pipe"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A stopped daemon's configuration and status file, with 2,000 sensors' windows (a status
    far larger than a pipe's 64 KiB buffer with ``--json``)."""
    path = tmp_path / "gateway.toml"
    path.write_text(CONFIG, encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    windows = {f"feature-{n}": {"sensors": n, "outcomes": {"ok": n, "gap": 0}} for n in range(2000)}
    status = {"gateway_id": "gw-pipe", "phase": "stopped", "updated_at": 0, "windows": windows}
    (state / "status.json").write_text(json.dumps(status), encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _assert_quiet(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["summary", "json"])
def test_a_reader_gone_before_the_first_write(config: Path, extra: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tesla_gateway", "status", *extra, "--config", str(config)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=REPO,
            env=_env(),
            check=False,
        )
    finally:
        os.close(write_end)
    _assert_quiet(result.stderr)
    assert result.returncode in (3, 141)  # 3: not running, as without the pipe


@pytest.mark.parametrize(
    "command", ["status", "status --json", "--help"], ids=["summary", "json", "help"]
)
def test_head_1(config: Path, command: str) -> None:
    argv = f"{sys.executable} -m tesla_gateway {command}"
    if command != "--help":
        argv += f" --config {config}"
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {argv} | head -1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=_env(),
        check=False,
    )
    _assert_quiet(result.stderr)
    assert result.stdout.count("\n") == 1
    assert result.returncode in (0, 3, 141)
