"""What a degraded start looks like in the systemd status line and the stats (no daemon run)."""

from __future__ import annotations

from pathlib import Path

from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.service import GatewayService
from tests.reliability.harness import DEFAULT_MODEL


def _service(tmp_path: Path, state: Path) -> GatewayService:
    """A service built from a real configuration (the default model), never run."""
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'gateway_id = "gw-1"\nstate_dir = "{state}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{DEFAULT_MODEL}"\n',
        encoding="utf-8",
    )
    return GatewayService(load_config(config_file))


def test_status_line_and_stats_name_set_aside_files_and_an_unwritable_pid_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    service = _service(tmp_path, state)
    service.models.refresh(force=True)  # the model serves: only the state problems remain
    state.mkdir(exist_ok=True)  # the served-version record may have made it
    (state / "gateway.pid").mkdir()  # the pid file cannot be written (as on a refusing disk)
    service._claim_pid_file()  # not fatal
    damaged = state / "pm10.npz"
    damaged.write_bytes(b"damaged")
    service.set_aside.set_aside(damaged, kind="window snapshot pm10", reason="test")
    try:
        line = service.reporter.status_line(service.reporter.stats())
        assert line.startswith("starting: 0 readings")
        assert "pid file" in line and "1 state file(s) set aside" in line
        stats = service.reporter.stats()["state"]
        assert isinstance(stats, dict)
        assert stats["set_aside"]["count"] == 1
        assert stats["problems"] and "pid file" in stats["problems"][0]
    finally:
        service._instance.release()


def test_a_status_file_that_cannot_be_written_is_logged_once_then_on_recovery(
    tmp_path: Path,
) -> None:
    """status.json fails at every interval on a full disk: one line, not one per interval."""
    from structlog.testing import capture_logs

    state = tmp_path / "state"
    service = _service(tmp_path, state)
    state.mkdir(exist_ok=True)
    status_file = service.config.status_file
    status_file.mkdir()  # a directory where the file goes: every write fails, as on a full disk
    try:
        with capture_logs() as logs:
            for _ in range(20):
                service.reporter.write_status({})
            status_file.rmdir()
            service.reporter.write_status({})
        events = [e["event"] for e in logs if e["event"].startswith("status_write")]
        assert events == ["status_write_failed", "status_write_recovered"]
        assert status_file.is_file()
    finally:
        service._instance.release()
