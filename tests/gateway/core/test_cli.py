"""The commands that talk to a daemon, when there is none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tesla_gateway.daemon.cli import main

CONFIG = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


def test_reload_without_a_daemon(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reload", "--config", str(config)]) == 1
    assert "no running gateway" in capsys.readouterr().err


def test_reload_ignores_a_stale_pid_file(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = config.parent / "state"
    state.mkdir()
    # our own pid, but this process is pytest, not a gateway: must not be signalled
    (state / "gateway.pid").write_text(f"{os.getpid()}\n")
    assert main(["reload", "--config", str(config)]) == 1
    assert "no running gateway" in capsys.readouterr().err


def test_status_without_a_status_file(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--config", str(config)]) == 3  # LSB: not running
    assert "no status file" in capsys.readouterr().err


def test_status_of_a_stopped_daemon(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = config.parent / "state"
    state.mkdir()
    (state / "status.json").write_text(
        '{"gateway_id": "gw-1", "version": "0.1.0", "phase": "stopped", "updated_at": 0,'
        ' "readings_in": 5, "rejected": {"total": 1, "by_reason": {"bad_json": 1}},'
        ' "ticker": {"published": 4}, "models": {"pm10": {"model": "m", "version": 3,'
        ' "runtime": "ai_edge_litert", "reloads": 1, "rejected": 0, "last_error": null},'
        ' "pm10-rh": {"feature": "pm10", "model": "m-rh", "version": 2, "channels":'
        ' ["pm10", "rh"], "runtime": "ai_edge_litert", "reloads": 1, "rejected": 0}}}'
    )
    assert main(["status", "--config", str(config)]) == 3  # LSB: not running
    out = capsys.readouterr().out
    assert "not running (last phase stopped)" in out
    assert "rejected 1 {'bad_json': 1}" in out
    assert "model pm10: m v3 on ai_edge_litert" in out
    assert "model pm10 (pm10-rh): m-rh v2 on ai_edge_litert" in out
    assert "channels pm10, rh" in out
    assert main(["status", "--json", "--config", str(config)]) == 3
    assert '"readings_in": 5' in capsys.readouterr().out


def test_status_shows_set_aside_files_and_a_degraded_start(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = config.parent / "state"
    state.mkdir()
    (state / "status.json").write_text(
        '{"gateway_id": "gw-1", "phase": "running", "updated_at": 0, "state": {"set_aside":'
        ' {"count": 2, "files": []}, "problems": ["pid file state/gateway.pid not written:'
        ' Read-only file system"]}}'
    )
    assert main(["status", "--config", str(config)]) == 3  # the pid file names no daemon
    out = capsys.readouterr().out
    assert "2 unreadable file(s) set aside" in out
    assert "degraded: pid file state/gateway.pid not written: Read-only file system" in out
