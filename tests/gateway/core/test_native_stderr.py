"""Native stderr (LiteRT's XNNPACK line) becomes a log event; JSON logs stay JSON lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.native_stderr import native_stderr_logged
from gateway.runtime import select_runtime

MODEL = Path(__file__).resolve().parents[3] / "models" / "pm10-ispra-1min" / "model.tflite"


def test_lines_written_to_fd_2_become_log_events(capfd: pytest.CaptureFixture[str]) -> None:
    with capture_logs() as logs, native_stderr_logged("a test"):
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\n")
        os.write(2, b'{"event": "written_by_another_thread", "level": "info"}\n')
        os.write(2, b"something without a level\n")
    assert logs == [
        {
            "event": "native_stderr",
            "log_level": "info",
            "message": "Created TensorFlow Lite XNNPACK delegate for CPU.",
            "during": "a test",
        },
        {
            "event": "native_stderr",
            "log_level": "warning",
            "message": "something without a level",
            "during": "a test",
        },
    ]
    err = capfd.readouterr().err
    assert err == '{"event": "written_by_another_thread", "level": "info"}\n'  # passed through
    os.write(2, b"after\n")  # fd 2 is restored
    assert capfd.readouterr().err == "after\n"


def test_the_real_interpreter_announces_xnnpack_only_as_a_log_event(
    capfd: pytest.CaptureFixture[str],
) -> None:
    runtime = select_runtime()
    with capture_logs() as logs:
        runtime.interpreter(MODEL.read_bytes())
    assert "XNNPACK" not in capfd.readouterr().err
    if runtime.name != "tensorflow":  # LiteRT and tflite-runtime print it on first allocation
        assert any("XNNPACK" in str(log.get("message")) for log in logs), logs
