"""Run the grid: per cell train → evaluate → export → measure, resumable, then write the report.

Per dataset the reference rows (raw, OLS, EPA) come first: they fix the case-study periods.
Each learned cell then trains with :func:`training.train.train` (scores on the test sensor),
exports with :func:`training.model_dir.export_run` (verified FlatBuffers + manifest) and is
measured (:mod:`training.bench.efficiency`). Runs and model directories go to the work
directory; each finished cell is one JSON file in ``<report>/cells/`` and is not recomputed
while its fingerprint (its training config and measurement) is unchanged.

A cell whose data cannot make windows (a covariate the data lacks, no valid window at that N)
is stored as *skipped* with the reason, as the paper marks window sizes it could not apply.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from training.bench.case_study import CasePeriod, select_case_periods, trace
from training.bench.cells import CaseTrace, CellResult, CellStore, fingerprint
from training.bench.efficiency import ExportOutcome, measure_efficiency
from training.bench.grid import COVARIATE_MODELS, MODELS, BenchConfig, Cell, DatasetSpec
from training.bench.progress import Progress
from training.bench.trained_runs import TrainedRun, forget_trained, mark_trained, reuse_trained
from training.bench.trust import measure_trust
from training.errors import DataError, DivergedTrainingError, ExportError
from training.reference_calibrations import (
    EPA_FEATURE,
    epa_purpleair_pm25,
    fit_ols,
    reference_rows,
)
from training.train import PreparedData, TrainConfig, prepare_data, train

__all__ = ["BenchSummary", "run_bench", "train_config"]


@dataclass
class BenchSummary:
    """Which cells this invocation computed, reused from the report dir, or skipped."""

    report_dir: Path
    computed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    excluded_datasets: list[str] = field(default_factory=list)

    def by_status(self, status: str) -> list[str]:
        """The list a cell of this status goes to (a stored "done" cell is reused)."""
        return {"skipped": self.skipped, "diverged": self.diverged}.get(status, self.reused)


def train_config(config: BenchConfig, spec: DatasetSpec, cell: Cell) -> TrainConfig:
    """The :class:`TrainConfig` of one learned cell (the budget applied to the model's entry)."""
    entry = MODELS[cell.model]
    if entry.model is None:
        raise ValueError(f"{cell.model!r} is a reference row; it is not trained")
    return TrainConfig(
        dataset=spec.dataset,
        data_path=spec.data_path,
        dataset_options=spec.options,
        window_length=cell.window_length,
        max_interpolated_periods=spec.max_interpolated_periods,
        channels=entry.channels,
        model=entry.model,
        epochs=config.epochs,
        batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        early_stopping_patience=config.early_stopping_patience,
        seed=0 if cell.seed is None else cell.seed,
        max_train_windows=config.max_train_windows,
    )


def _data_config(config: BenchConfig, spec: DatasetSpec, channels: tuple[str, ...]) -> TrainConfig:
    return TrainConfig(
        dataset=spec.dataset,
        data_path=spec.data_path,
        dataset_options=spec.options,
        window_length=config.window_length,
        max_interpolated_periods=spec.max_interpolated_periods,
        channels=channels,
    )


def _is_case_cell(config: BenchConfig, cell: Cell) -> bool:
    return cell.model in config.case_study_models and cell.window_length == config.window_length


def _learned_fingerprint(config: BenchConfig, spec: DatasetSpec, cell: Cell) -> str:
    payload: dict[str, object] = {
        "train": train_config(config, spec, cell).model_dump(mode="json"),
        "full": cell.full,
        "case": config.case_study_periods if _is_case_cell(config, cell) else None,
    }
    if cell.model in COVARIATE_MODELS:
        # Covariate models scale each input channel in the graph since issue 17: cells stored
        # before are another model and are computed again (the others stay reusable).
        payload["input_scaling"] = "per-channel"
    return fingerprint(payload)


def _reference_fingerprint(config: BenchConfig, spec: DatasetSpec) -> str:
    return fingerprint(
        {
            "data": _data_config(config, spec, ("raw",)).model_dump(mode="json"),
            "case": config.case_study_periods,
        }
    )


def _test_timestamps(prepared: PreparedData) -> np.ndarray:
    return prepared.test.meta()["period_start_s"].to_numpy(dtype=np.int64)


def _reference_cells(
    config: BenchConfig, spec: DatasetSpec, store: CellStore, summary: BenchSummary
) -> list[CellResult]:
    """Compute (or reuse) raw, OLS and EPA for the dataset at the main N."""
    cells = config.reference_cells(spec)
    expected = _reference_fingerprint(config, spec)
    stored = [store.load(cell, expected) for cell in cells]
    if all(result is not None for result in stored):
        summary.reused += [cell.label for cell in cells]
        return [result for result in stored if result is not None]

    prepared = prepare_data(_data_config(config, spec, ("raw",)))
    feature = prepared.data.feature
    rows = reference_rows(prepared.train, prepared.test, feature)
    ols = fit_ols(prepared.train)
    stamps = _test_timestamps(prepared)
    targets = prepared.test.targets()
    current = prepared.test.current_raw()
    periods = select_case_periods(
        stamps, targets, prepared.data.period_seconds, config.case_study_periods
    )
    common: dict[str, Any] = {
        "dataset": spec.key,
        "region": spec.region_label,
        "feature": feature,
        "group": "reference",
        "window_length": config.window_length,
        "seed": None,
        "fingerprint": expected,
        "test_sensor": prepared.summary.test_sensor,
        "windows": dict(prepared.summary.windows),
        "test_raw": rows["raw"],
        "test_ols": rows["ols"],
    }
    predictions = {"raw": current, "ols": ols.predict(current)}
    results: list[CellResult] = []
    for cell in cells:
        if cell.model in predictions:
            result = CellResult(
                model=cell.model,
                status="done",
                test=rows[cell.model],
                case=[trace(p, stamps, targets, predictions[cell.model]) for p in periods],
                **common,
            )
        else:
            result = _epa_cell(config, spec, prepared, periods, common)
        store.save(cell, result)
        summary.computed.append(cell.label)
        results.append(result)
    return results


def _epa_cell(
    config: BenchConfig,
    spec: DatasetSpec,
    prepared: PreparedData,
    periods: list[CasePeriod],
    common: dict[str, Any],
) -> CellResult:
    feature = prepared.data.feature
    if feature != EPA_FEATURE:
        reason = f"the EPA PurpleAir correction is for PM2.5; this dataset is {feature}"
        return CellResult(model="epa", status="skipped", reason=reason, **common)
    if "rh" not in prepared.data.covariates:
        reason = "the data carry no relative humidity"
        return CellResult(model="epa", status="skipped", reason=reason, **common)
    humid = prepare_data(_data_config(config, spec, ("raw", "rh")))
    rows = reference_rows(humid.train, humid.test, feature)
    current = humid.test.current_raw()
    rh_windows, _ = humid.test.gather(np.arange(len(humid.test)))
    corrected = epa_purpleair_pm25(current, rh_windows[:, -1, 1])
    stamps = _test_timestamps(humid)
    targets = humid.test.targets()
    fields = {**common, "test_raw": rows["raw"], "test_ols": rows["ols"]}
    fields["windows"] = dict(humid.summary.windows)
    return CellResult(
        model="epa",
        status="done",
        test=rows["epa"],
        case=[trace(p, stamps, targets, corrected) for p in periods],
        **fields,
    )


def _export(
    result_model: keras.Model, run_dir: Path, model_dir: Path, name: str, *, full: bool
) -> ExportOutcome:
    """Full export (verified model directory) or, for sweep cells, the float FlatBuffer only."""
    from training.export import FLOAT_FILENAME, INT8_FILENAME, convert_float
    from training.model_dir import export_run

    if not full:
        return ExportOutcome(
            float_bytes=convert_float(result_model),
            int8_path=None,
            verified=False,
            reason="float export only (sweep cell)",
            arena_bytes=None,
        )
    shutil.rmtree(model_dir, ignore_errors=True)
    try:
        # The bench measures every model, including ones that lose to linear (force), and
        # needs both graphs verified (targets both: a device failure is its reported outcome).
        exported = export_run(run_dir, model_dir, name=name, version=1, targets="both", force=True)
    except ExportError as exc:
        float_path = model_dir / FLOAT_FILENAME
        int8_path = model_dir / INT8_FILENAME
        return ExportOutcome(
            float_bytes=(
                float_path.read_bytes() if float_path.is_file() else convert_float(result_model)
            ),
            int8_path=int8_path if int8_path.is_file() else None,
            verified=False,
            reason=str(exc),
            arena_bytes=None,
        )
    verification = exported.verification
    return ExportOutcome(
        float_bytes=(model_dir / FLOAT_FILENAME).read_bytes(),
        int8_path=model_dir / INT8_FILENAME,
        verified=True,
        reason=None,
        arena_bytes=verification.tflm_arena_bytes,
        float_rmse_vs_reference=verification.float_rmse_vs_reference,
        integer_rmse_vs_reference=verification.integer_rmse_vs_reference,
    )


def _case_traces(
    model: keras.Model, prepared: PreparedData, raw_cell: CellResult | None
) -> list[CaseTrace]:
    """This model's values over the reference rows' case-study periods."""
    if raw_cell is None or not raw_cell.case:
        return []
    stamps = _test_timestamps(prepared)
    wanted = {t for period in raw_cell.case for t in period.timestamps_s}
    indices = np.flatnonzero(np.isin(stamps, np.fromiter(wanted, dtype=np.int64)))
    values = np.full(len(stamps), np.nan)
    targets = np.full(len(stamps), np.nan)
    if indices.size:
        x, y = prepared.test.gather(indices)
        values[indices] = np.asarray(model.predict(x, verbose=0, batch_size=1024)).reshape(-1)
        targets[indices] = y
    periods = [
        CasePeriod(label=p.label, timestamps_s=np.asarray(p.timestamps_s, dtype=np.int64))
        for p in raw_cell.case
    ]
    return [trace(p, stamps, targets, values) for p in periods]


def _learned_cell(
    config: BenchConfig,
    spec: DatasetSpec,
    cell: Cell,
    *,
    expected: str,
    work_dir: Path,
    raw_cell: CellResult | None,
    progress: Progress,
) -> CellResult:
    entry = MODELS[cell.model]
    tc = train_config(config, spec, cell)
    region = raw_cell.region if raw_cell else spec.region_label
    feature = raw_cell.feature if raw_cell else "unknown"
    common: dict[str, Any] = {
        "dataset": spec.key,
        "region": region,
        "feature": feature,
        "model": cell.model,
        "group": entry.group,
        "window_length": cell.window_length,
        "seed": cell.seed,
        "fingerprint": expected,
    }
    cell_dir = work_dir / Path(cell.file_name).stem
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    try:
        prepared = prepare_data(tc)
    except DataError as exc:
        return CellResult(status="skipped", reason=str(exc), **common)
    run_dir = cell_dir / "run"
    reused = reuse_trained(run_dir, expected, tc)
    if isinstance(reused, TrainedRun):
        progress.note(f"{cell.label}: reusing its finished training in {run_dir}")
        result = reused.result
        seconds["train"] = reused.train_seconds
    else:
        if reused is not None:
            progress.note(f"{cell.label}: training again, {reused}")
        forget_trained(run_dir)
        diverged: str | None = None
        try:
            with progress.training(f"{cell.model} N={cell.window_length}"):
                result = train(tc, run_dir, verbose=0)
        except DivergedTrainingError as exc:  # a result of the protocol, reported, never ranked
            diverged = str(exc)
        seconds["train"] = time.perf_counter() - started
        if diverged is not None:
            return CellResult(status="diverged", reason=diverged, seconds=seconds, **common)
        mark_trained(run_dir, expected, seconds["train"])

    progress.stage("exporting")
    started = time.perf_counter()
    outcome = _export(
        result.model,
        run_dir,
        cell_dir / "model",
        "bench-" + cell.model.replace("+", "-"),
        full=cell.full,
    )
    seconds["export"] = time.perf_counter() - started

    progress.stage("measuring")
    started = time.perf_counter()
    sample, _ = prepared.test.gather(np.array([0]))
    efficiency = measure_efficiency(result.model, outcome, sample[0], device=cell.full)
    case = _case_traces(result.model, prepared, raw_cell) if _is_case_cell(config, cell) else []
    trust = measure_trust(result.model, prepared)
    seconds["measure"] = time.perf_counter() - started

    used = len(prepared.train)
    if config.max_train_windows is not None:
        used = min(used, config.max_train_windows)
    return CellResult(
        status="done",
        test=result.test.model,
        validation=result.validation,
        test_raw=result.test.raw,
        test_ols=result.test.linear,
        test_sensor=prepared.summary.test_sensor,
        windows=dict(prepared.summary.windows),
        train_windows_used=used,
        epochs_run=len(result.history.get("loss", [])),
        history=result.history,
        seconds={k: round(v, 2) for k, v in seconds.items()},
        efficiency=efficiency,
        case=case,
        trust=trust,
        **common,
    )


QueuedCell = tuple[DatasetSpec, CellResult | None, Cell, str]


def compute_order(
    queue: Sequence[QueuedCell], seeds: Sequence[int], defer: Sequence[str] = ()
) -> list[QueuedCell]:
    """Order queued ``(spec, raw cell, cell, fingerprint)``: deferred models last, then by seed.

    The sort is stable, so datasets and models keep the grid's order within one seed.
    """
    rank = {seed: index for index, seed in enumerate(seeds)}
    deferred = set(defer)

    def key(entry: QueuedCell) -> tuple[bool, int]:
        cell = entry[2]
        return cell.model in deferred, -1 if cell.seed is None else rank.get(cell.seed, len(rank))

    return sorted(queue, key=key)


def run_bench(
    config: BenchConfig,
    report_dir: Path,
    *,
    work_dir: Path | None = None,
    progress: bool = True,
    write: bool = True,
    defer: Sequence[str] = (),
) -> BenchSummary:
    """Compute every cell not already stored, then write the report (unless ``write=False``).

    Cells run seed by seed (every dataset's seed 0 before any seed 1), so a run stopped early
    leaves whole seeds; the models in ``defer`` run after all others, so a long run's cheap
    cells are stored first.
    """
    from training.bench.report import write_report

    report_dir.mkdir(parents=True, exist_ok=True)
    work = work_dir if work_dir is not None else report_dir / "work"
    if work_dir is None:
        (report_dir / ".gitignore").write_text("work/\n", encoding="utf-8")
    store = CellStore(report_dir)
    summary = BenchSummary(report_dir=report_dir)

    plan: list[tuple[DatasetSpec, list[tuple[Cell, str]]]] = []
    for spec in config.datasets:
        pending = []
        for cell in config.cells(spec):
            expected = _learned_fingerprint(config, spec, cell)
            stored = store.load(cell, expected)
            if stored is None:
                pending.append((cell, expected))
            else:
                summary.by_status(stored.status).append(cell.label)
        plan.append((spec, pending))

    display = Progress(sum(len(p) for _, p in plan), enabled=progress)
    try:
        queue: list[QueuedCell] = []
        for spec, pending in plan:
            references = _reference_cells(config, spec, store, summary)
            raw_cell = next((r for r in references if r.model == "raw"), None)
            if config.features is not None and raw_cell and raw_cell.feature not in config.features:
                summary.excluded_datasets.append(spec.key)
                display.note(f"{spec.key}: feature {raw_cell.feature} not in {config.features}")
                continue
            queue += [(spec, raw_cell, cell, expected) for cell, expected in pending]
        for spec, raw_cell, cell, expected in compute_order(queue, config.seeds, defer):
            display.start(cell.label)
            result = _learned_cell(
                config,
                spec,
                cell,
                expected=expected,
                work_dir=work / spec.key,
                raw_cell=raw_cell,
                progress=display,
            )
            store.save(cell, result)
            if result.status != "done":
                summary.by_status(result.status).append(cell.label)
                display.finish(f"{cell.label}: {result.status} ({result.reason})")
            else:
                summary.computed.append(cell.label)
                test = result.test
                spent = sum(result.seconds.values())
                display.finish(
                    f"{cell.label}: test RMSE {test.rmse:.2f} MAE {test.mae:.2f} ({spent:.0f} s)"
                    if test
                    else cell.label
                )
    finally:
        display.close()
    if write:
        write_report(config, report_dir)
    return summary
