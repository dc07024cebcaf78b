"""Run the benchmarks, print a table and write ``devkit/bench/results.json``.

Single-threaded throughout (BLAS and LiteRT on one thread), so figures are "per core".
"""

from __future__ import annotations

import os
import sys

if os.environ.get("OPENBLAS_NUM_THREADS") != "1":  # must be set before NumPy loads BLAS
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    os.execv(sys.executable, [sys.executable, "-m", "devkit.bench", *sys.argv[1:]])  # noqa: S606 - re-exec self

from devkit.bench.main import main  # imported after the thread settings above

sys.exit(main(sys.argv[1:]))
