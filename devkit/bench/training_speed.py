"""Training throughput: windows per second of one TESLA epoch, and the process's peak memory.

Runs as a child process (``python -m devkit.bench.training_speed``) so its peak memory is its
own. The data is the synthetic generator's (a fixed seed), so the figure needs no data files.
"""

from __future__ import annotations

import json
import resource
import sys
import time

__all__: list[str] = []


def _main(argv: list[str]) -> None:
    import keras
    import numpy as np

    from tesla_gateway.contract.series import GapPolicy
    from training.data import WindowSet, generate_synthetic, to_grid
    from training.models import TeslaConfig, build_model
    from training.train import WindowBatches

    sensors = int(argv[0]) if argv else 6
    data = generate_synthetic(n_sensors=sensors, days=10, period_seconds=60, seed=1)
    windows = WindowSet.build(
        list(to_grid(data).values()), 360, GapPolicy(max_interpolated_periods=30)
    )
    model = build_model(TeslaConfig(), 360, 1, 100.0)
    model.compile(optimizer=keras.optimizers.Adam(3e-4), loss="mse")
    batches = WindowBatches(windows, np.arange(len(windows), dtype=np.int64), 32, 0)
    model.fit(batches, epochs=1, verbose=0, steps_per_epoch=20)  # compile and warm up
    start = time.perf_counter()
    model.fit(batches, epochs=1, verbose=0)
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "windows": len(windows),
                "windows_per_s": len(windows) / elapsed,
                "epoch_s": elapsed,
                "peak_rss_bytes": peak_kib * 1024,
                "series_bytes": windows.nbytes,
                "materialised_bytes_would_be": len(windows) * 360 * 4,
            }
        )
    )


if __name__ == "__main__":
    _main(sys.argv[1:])
