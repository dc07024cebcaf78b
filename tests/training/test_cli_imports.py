"""The training CLI answers a refusal or --help without loading TensorFlow (15 s on a Pi-class
machine): subcommands import what trains only when they train."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_module_loads_without_tensorflow() -> None:
    probe = (
        "import sys, training.cli; "
        "heavy = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules); "
        "print(','.join(heavy))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert completed.stdout.strip() == ""


def test_a_refused_calibrate_intervals_does_not_load_tensorflow() -> None:
    """A wrong --model is answered at once: the folds' training stack loads only to train."""
    probe = (
        "import sys; from training.cli import main; "
        "code = main(['calibrate-intervals', '--model', '/nonexistent/model']); "
        "print(code, 'tensorflow' in sys.modules)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert completed.stdout.split() == ["2", "False"]
    assert "/nonexistent/model/manifest.json does not exist" in completed.stderr
