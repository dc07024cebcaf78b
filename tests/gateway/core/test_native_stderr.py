"""Native stderr (LiteRT's XNNPACK line) becomes a log event; JSON logs stay JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tesla_gateway.models.native_stderr import native_stderr_logged

REPO = Path(__file__).resolve().parents[3]
MODEL = REPO / "models" / "pm10-ispra-1min" / "model.tflite"


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


# A fresh process: LiteRT announces XNNPACK once per process, and another test may already
# have loaded a model in this one.
_CREATE_INTERPRETER = """
import sys
from pathlib import Path
from tesla_gateway.daemon.logging import configure_logging
from tesla_gateway.models.runtime import select_runtime
configure_logging("json", "info")
runtime = select_runtime()
runtime.interpreter(Path(sys.argv[1]).read_bytes())
print(runtime.name)
"""


def test_the_real_interpreter_leaves_only_json_on_stderr() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _CREATE_INTERPRETER, str(MODEL)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    events = [json.loads(line) for line in result.stderr.splitlines()]  # raises on a raw line
    if result.stdout.strip() != "tensorflow":  # LiteRT and tflite-runtime print it
        assert [e["message"] for e in events if e["event"] == "native_stderr"] == [
            "Created TensorFlow Lite XNNPACK delegate for CPU."
        ]


def test_without_a_file_descriptor_2_the_block_still_runs() -> None:
    """A daemon started with fd 2 closed must still load its models."""
    saved = os.dup(2)
    os.close(2)
    try:
        ran = False
        with native_stderr_logged("a test"):
            ran = True
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert ran
