"""The fallback runtime (tflite-runtime 2.14, numpy<2) runs the committed models like LiteRT.

tflite-runtime crashes with NumPy 2, so it lives in its own venv (``.venv-legacy``, made by
``make setup``); the check runs the gateway's own Calibrator there in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.models.calibrator import Calibrator

REPO = Path(__file__).resolve().parents[3]
LEGACY_PYTHON = REPO / ".venv-legacy" / "bin" / "python"
MODELS = ("pm10-ispra-1min", "pm2_5-antwerp-1h")

SCRIPT = """
import json, sys
import numpy as np
from pathlib import Path
from tesla_gateway.models.calibrator import Calibrator
windows = np.array(json.loads(sys.stdin.read()), dtype=np.float32)
calibrator = Calibrator.load(Path(sys.argv[1]), runtime_preference=["tflite_runtime"])
print(json.dumps({"runtime": calibrator.runtime_name, "version": calibrator.runtime_version,
                  "numpy": np.__version__, "out": calibrator.calibrate(windows).tolist()}))
"""


@pytest.mark.parametrize("name", MODELS)
def test_tflite_runtime_fallback_matches_litert(name: str) -> None:
    if not LEGACY_PYTHON.exists():
        pytest.fail(f"{LEGACY_PYTHON} is missing: run `make setup` (it builds the legacy venv)")
    model_dir = REPO / "models" / name
    litert = Calibrator.load(model_dir, runtime_preference=["ai_edge_litert"])
    rng = np.random.default_rng(7)
    windows = rng.gamma(2.0, 15.0, size=(5, litert.manifest.window_length)).astype(np.float32)
    completed = subprocess.run(
        [str(LEGACY_PYTHON), "-c", SCRIPT, str(model_dir)],
        input=json.dumps(windows.tolist()),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["runtime"] == "tflite_runtime"
    assert result["numpy"].startswith("1.")
    np.testing.assert_allclose(result["out"], litert.calibrate(windows), rtol=1e-4, atol=1e-3)
