"""``python -m training bench``: the paper's comparison on any co-location data.

For chosen datasets (regions × features) × models × seeds: train, evaluate on the test sensor,
export, measure; then write a report directory (tables, CSVs, PNGs, ``results.json``).
Resumable: finished cells are stored and not recomputed.

Modules: :mod:`~training.bench.grid` (model names, budget, cells), :mod:`~training.bench.runner`
(train → evaluate → export → measure), :mod:`~training.bench.efficiency` and
:mod:`~training.bench.flops` (cost), :mod:`~training.bench.report` and
:mod:`~training.bench.plots` (output), :mod:`~training.bench.cli` (the subcommand). The package
imports nothing itself, so the command line starts without loading TensorFlow.
"""

__all__: list[str] = []
