"""Memory of a gateway process: the daemon's model and window store, empty and full.

Runs as a child process (``python -m devkit.bench.footprint MODEL_DIR S1 S2 …``) so that what it
measures is a process holding exactly what the daemon holds: the imports of the daemon, one
loaded model, and the windows of S sensors filled to N, plus the batch a tick builds from them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

__all__ = ["resident_bytes"]


def resident_bytes() -> int:
    """Current resident set size of this process (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _main(argv: list[str]) -> None:
    started = time.perf_counter()
    import numpy as np

    import tesla_gateway.daemon.service  # noqa: F401 - the daemon's own import graph
    from tesla_gateway.models.calibrator import Calibrator
    from tesla_gateway.windows.ring import ModelWindows
    from tesla_gateway.windows.state import NO_PERIOD, WindowState

    calibrator = Calibrator.load(Path(argv[0]), num_threads=1)
    report: dict[str, object] = {
        "import_and_load_s": time.perf_counter() - started,
        "rss_start_bytes": resident_bytes(),
    }
    geometry = calibrator.geometry
    n, c = geometry.window_length, len(geometry.channels)
    for sensors in (int(arg) for arg in argv[1:]):
        rng = np.random.default_rng(sensors)
        last = 10_000_000
        state = WindowState(
            geometry=geometry,
            sensor_ids=[f"node-{i:05d}" for i in range(sensors)],
            ring=rng.gamma(2.0, 15.0, size=(sensors, c, n)),
            last_closed=np.full(sensors, last, dtype=np.int64),
            first_period=np.full(sensors, last - 2 * n, dtype=np.int64),
            last_obs_period=np.full((sensors, c), last, dtype=np.int64),
            last_obs_value=rng.gamma(2.0, 15.0, size=(sensors, c)),
            open_period=np.full(sensors, NO_PERIOD, dtype=np.int64),
            open_sum=np.zeros((sensors, c)),
            open_count=np.zeros((sensors, c), dtype=np.int64),
            open_seen=[[] for _ in range(sensors)],
            pending_period=np.full(sensors, last, dtype=np.int64),
        )
        windows = ModelWindows.from_state(state)
        del state
        ready = windows.ready_windows()
        calibrator.calibrate(ready.windows)
        report[f"rss_{sensors}_bytes"] = resident_bytes()
        exported = windows.export_state()
        array_bytes = (
            sum(value.nbytes for value in vars(exported).values() if isinstance(value, np.ndarray))
            if hasattr(exported, "__dict__")
            else sum(
                getattr(exported, name).nbytes
                for name in exported.__dataclass_fields__
                if isinstance(getattr(exported, name), np.ndarray)
            )
        )
        id_bytes = sum(len(sensor_id) for sensor_id in exported.sensor_ids)
        report[f"state_bytes_per_sensor_{sensors}"] = (array_bytes + id_bytes) / sensors
        report["raw_window_bytes_per_sensor"] = exported.ring.nbytes / sensors
        del windows, ready
    print(json.dumps(report))


if __name__ == "__main__":
    _main(sys.argv[1:])
