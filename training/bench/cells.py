"""The stored result of one grid cell, and the report directory's cell store (resumability).

Each finished cell is one JSON file under ``<report>/cells/``. A cell whose file exists with the
same fingerprint (a hash of everything that decides its result) is not recomputed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tesla_gateway.contract.manifest import ErrorMetrics
from training.bench.grid import Cell

__all__ = [
    "CELL_FORMAT",
    "CaseTrace",
    "CellResult",
    "CellStore",
    "Efficiency",
    "TflmStatus",
    "TrustScores",
    "fingerprint",
]

CELL_FORMAT = 1  # bump when a cell's meaning changes: every stored cell is then recomputed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TflmStatus(_Strict):
    """Whether the device graph runs under TFLite Micro, with which arena, or why not."""

    runs: bool
    arena_bytes: int | None = None
    reason: str | None = None


class Efficiency(_Strict):
    """Cost of one calibration (batch 1); methods in :mod:`training.bench.efficiency`."""

    parameters: int
    flops: int
    flops_by_op: dict[str, int]
    uncounted_ops: list[str] = Field(default_factory=list)
    peak_activation_bytes: int
    weight_bytes: int
    float_bytes: int
    int8_bytes: int | None = None
    int8_flops: int | None = None
    litert_us_float: float
    litert_us_int8: float | None = None
    tflm: TflmStatus
    export_verified: bool
    export_reason: str | None = None
    integer_rmse_vs_reference: float | None = None
    float_rmse_vs_reference: float | None = None


class TrustScores(_Strict):
    """Intervals fitted on the validation sensor, scored on the test sensor, and the EU GDE
    figures on the test sensor's daily means (training/conformal.py, training/equivalence.py)."""

    interval_level: float | None = None
    interval_coverage: float | None = None
    interval_mean_width: float | None = None
    gde_days: int | None = None
    gde_limit_value: float | None = None
    gde_expanded_relative_uncertainty: float | None = None
    gde_slope: float | None = None
    gde_intercept: float | None = None
    gde_r2: float | None = None
    meets_indicative_dqo: bool | None = None


class CaseTrace(_Strict):
    """One case-study period of the test sensor: reference and this row's values."""

    label: Literal["low", "mid", "high"]
    timestamps_s: list[int]
    reference: list[float | None]
    values: list[float | None]


class CellResult(_Strict):
    """Everything measured for one cell (numbers in the feature's unit, µg/m³)."""

    dataset: str
    region: str
    feature: str
    model: str
    group: str
    window_length: int
    seed: int | None
    fingerprint: str
    status: Literal["done", "skipped", "diverged"]
    reason: str | None = None
    test: ErrorMetrics | None = None
    validation: ErrorMetrics | None = None
    test_raw: ErrorMetrics | None = None
    test_ols: ErrorMetrics | None = None
    test_sensor: str | None = None
    windows: dict[str, int] = Field(default_factory=dict)
    train_windows_used: int | None = None
    epochs_run: int | None = None
    history: dict[str, list[float]] = Field(default_factory=dict)
    seconds: dict[str, float] = Field(default_factory=dict)
    efficiency: Efficiency | None = None
    case: list[CaseTrace] = Field(default_factory=list)
    trust: TrustScores | None = None  # cells stored before it existed load without it


def fingerprint(payload: object) -> str:
    """Stable hash of a JSON-able description of what decides a cell's result."""
    text = json.dumps({"format": CELL_FORMAT, "cell": payload}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class CellStore:
    """``<report>/cells/*.json``: load a finished cell, save one atomically."""

    def __init__(self, report_dir: Path) -> None:
        self.directory = report_dir / "cells"

    def path(self, cell: Cell) -> Path:
        return self.directory / cell.file_name

    def load(self, cell: Cell, expected_fingerprint: str | None = None) -> CellResult | None:
        """The stored result, or None when absent, unreadable, computed for another config, or
        scored over no window at all (a diverged run from before divergence was detected)."""
        path = self.path(cell)
        if not path.is_file():
            return None
        try:
            result = CellResult.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError):
            return None
        if expected_fingerprint is not None and result.fingerprint != expected_fingerprint:
            return None
        if result.status == "done" and result.test is not None and result.test.n == 0:
            return None  # a diverged run stored as done before the check existed: run it again
        return result

    def save(self, cell: Cell, result: CellResult) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(cell)
        partial = path.with_suffix(".json.partial")
        partial.write_text(result.model_dump_json(indent=1) + "\n", encoding="utf-8")
        partial.replace(path)
        return path
