"""The calibration ladder: raw readings, the classical fits and TESLA, compared on validation.

A user with a few hundred hours of co-location gets a TESLA model the guard refuses (worse than
a straight line on the validation sensor) and, before this, no model at all. ``train`` now
also fits the calibrations practitioners use (training/classical.py) on the same training
sensors and scores every candidate on the **same** validation windows (those valid for every
channel the data have, so a candidate with more inputs is not scored on fewer, easier
windows). The lowest validation RMSE wins; a tie goes to the simpler candidate (the order of
:data:`LADDER_ORDER`). When nothing beats the raw readings the ladder says so and ``export``
writes nothing unless forced. ``ladder.json`` in the run directory records it all; the
exported manifest carries the candidates and the reason (``candidates``, ``choice``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import CandidateScore, DataSummary, ErrorMetrics
from tesla_gateway.contract.series import GapPolicy
from training.classical import ClassicalFit, ClassicalKind, fit_classical
from training.data import CoLocationData, GriddedSensor, WindowSet, clean, load_dataset, to_grid
from training.data.split import SensorSplit, paper_split
from training.errors import DataError, RunDirError
from training.metrics import error_metrics
from training.train import TrainConfig, load_run

__all__ = [
    "LADDER_FILENAME",
    "LADDER_ORDER",
    "Ladder",
    "LadderData",
    "fit_ladder",
    "load_ladder",
]

LADDER_FILENAME = "ladder.json"
LADDER_ORDER = ("raw", "linear", "multilinear", "growth", "tesla", "tesla-fine-tuned")
COVARIATE_CHANNELS = ("rh", "temp_c")
Array = npt.NDArray[np.float32]


class LadderData:
    """The run's data loaded, cleaned and gridded once; window sets for any channels."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        loaded = load_dataset(config.dataset, config.data_path, **config.dataset_options)
        self.source = f"{config.dataset}:{loaded.source}"
        self.data: CoLocationData
        self.data, self.report = clean(loaded)
        self.sensors: dict[str, GriddedSensor] = to_grid(self.data)
        self.split: SensorSplit = paper_split(sorted(self.sensors))
        self.policy = GapPolicy(max_interpolated_periods=config.max_interpolated_periods)
        self._sets: dict[tuple[tuple[str, ...], str], WindowSet] = {}

    @cached_property
    def covariates(self) -> tuple[str, ...]:
        """The covariates the data carry (a column with at least one value)."""
        frame = self.data.frame
        return tuple(c for c in COVARIATE_CHANNELS if c in frame.columns and frame[c].notna().any())

    def windows(self, channels: tuple[str, ...], role: str) -> WindowSet:
        """Windows of ``role`` ('train', 'validation', 'test') valid for ``channels``."""
        key = (channels, role)
        if key not in self._sets:
            ids = {
                "train": self.split.train,
                "validation": (self.split.validation,),
                "test": (self.split.test,),
            }[role]
            self._sets[key] = WindowSet.build(
                [self.sensors[i] for i in ids],
                self.config.window_length,
                self.policy,
                channels=channels,
            )
        return self._sets[key]

    def summary(self, channels: tuple[str, ...]) -> DataSummary:
        """The manifest's data summary for a model reading ``channels``."""
        return DataSummary(
            source=self.source,
            target=self.data.target,
            train_sensors=list(self.split.train),
            validation_sensor=self.split.validation,
            test_sensor=self.split.test,
            rows_read=self.report.rows_read,
            rows_dropped=dict(self.report.rows_dropped),
            sensors_dropped=list(self.report.sensors_dropped),
            windows={r: len(self.windows(channels, r)) for r in ("train", "validation", "test")},
            attribution=self.data.attribution,
        )


@dataclass(frozen=True)
class Ladder:
    """Every candidate's figures, the winner (None: nothing beats raw) and why."""

    candidates: tuple[CandidateScore, ...]
    winner: str | None
    best_model: str | None  # the best candidate that is not the raw readings (--force)
    reason: str
    fits: Mapping[str, ClassicalFit]
    runs: Mapping[str, str]  # TESLA candidate -> its run directory, relative to the run's

    def as_json(self) -> dict[str, object]:
        return {
            "candidates": [c.model_dump(mode="json") for c in self.candidates],
            "winner": self.winner,
            "best_model": self.best_model,
            "reason": self.reason,
            "fits": {name: fit.as_dict() for name, fit in self.fits.items()},
            "runs": dict(self.runs),
        }

    def table(self) -> str:
        """The ladder as text lines for the terminal."""
        lines = []
        for c in self.candidates:
            figures = (
                "not fitted"
                if c.validation is None
                else f"validation RMSE {c.validation.rmse:8.3f}  MAE {c.validation.mae:8.3f}"
                + ("" if c.test is None else f"  (test RMSE {c.test.rmse:.3f})")
            )
            mark = "*" if c.name == self.winner else " "
            note = f"  [{c.note}]" if c.note else ""
            lines.append(f"{mark} {c.name:<17} {figures}{note}")
        return "\n".join([*lines, self.reason])


def _score(predicted: npt.ArrayLike, windows: WindowSet) -> ErrorMetrics:
    return error_metrics(np.asarray(predicted, dtype=np.float64), windows.targets())


def _select(x: Array, wide: tuple[str, ...], channels: tuple[str, ...]) -> Array:
    """The columns of wide windows ``x`` [B, N, C] a model with ``channels`` reads."""
    if len(wide) == 1:
        return x
    columns = [wide.index(c) for c in channels]
    return x[:, :, columns[0]] if len(columns) == 1 else x[:, :, columns]


def _tesla_candidate(
    name: str, run: Path, validation: WindowSet, test: WindowSet
) -> CandidateScore:
    """A TESLA run scored on the ladder's windows (its model loaded once for both sets)."""
    config, model, metrics = load_run(run)
    if config.window_length != validation.window_length:
        raise RunDirError(
            f"{run} has N={config.window_length}, the ladder {validation.window_length}"
        )

    def predict(windows: WindowSet) -> npt.NDArray[np.float64]:
        outputs = []
        for start in range(0, len(windows), 4096):
            x, _ = windows.gather(np.arange(start, min(start + 4096, len(windows))))
            selected = _select(x, windows.channels, config.channels)
            outputs.append(np.asarray(model.predict(selected, verbose=0, batch_size=1024)).ravel())
        return np.concatenate(outputs).astype(np.float64)

    return CandidateScore(
        name=name,
        architecture=config.model.kind,
        input_channels=list(config.channels),
        parameters=int(metrics["parameters"]),
        validation=_score(predict(validation), validation),
        test=_score(predict(test), test),
    )


def _classical_candidates(
    data: LadderData, wide: tuple[str, ...], validation: WindowSet, test: WindowSet
) -> tuple[list[CandidateScore], dict[str, ClassicalFit]]:
    available = wide[1:]  # the covariates every compared window holds
    sparse = "too sparse for whole windows in every split" if data.covariates else None
    plans: list[tuple[ClassicalKind, tuple[str, ...], str | None]] = [
        ("linear", ("raw",), None),
        (
            "multilinear",
            ("raw", *available),
            None if available else sparse or "the data have no humidity or temperature",
        ),
        (
            "growth",
            ("raw", "rh"),
            None if "rh" in available else sparse or "the data have no humidity",
        ),
    ]
    scores: list[CandidateScore] = []
    fits: dict[str, ClassicalFit] = {}
    for kind, channels, missing in plans:
        architecture = f"classical-{kind}"
        if missing is not None:
            scores.append(CandidateScore(name=kind, architecture=architecture,
                                         input_channels=list(channels), parameters=0,
                                         note=missing))  # fmt: skip
            continue
        fit = fit_classical(kind, data.windows(channels, "train"), channels)
        fits[kind] = fit
        note = None if fit.k is None else f"k = {fit.k:.3g}"
        scores.append(
            CandidateScore(
                name=kind,
                architecture=architecture,
                input_channels=list(channels),
                parameters=fit.parameters,
                validation=_score(fit.predict(validation), validation),
                test=_score(fit.predict(test), test),
                note=note,
            )
        )
    return scores, fits


def _wide_channels(data: LadderData) -> tuple[str, ...]:
    """The reading plus every covariate the data have, as long as each split keeps windows
    (else the run's own channels, which have windows in every split or train would have
    failed)."""
    wide = ("raw", *data.covariates)
    roles = ("train", "validation", "test")
    if len(wide) > 1 and any(len(data.windows(wide, role)) == 0 for role in roles):
        return data.config.channels  # a covariate too sparse for whole windows: TESLA's own
    return wide


def choose(
    candidates: tuple[CandidateScore, ...], sensor: str
) -> tuple[str | None, str | None, str]:
    """The winner (None: the raw readings), the best candidate that is not raw, and why."""
    scored = sorted(
        ((c.validation, c.name) for c in candidates if c.validation is not None),
        key=lambda pair: (pair[0].rmse, LADDER_ORDER.index(pair[1])),
    )
    raw = next(metrics for metrics, name in scored if name == "raw")
    models = [(metrics, name) for metrics, name in scored if name != "raw"]
    best = models[0][1] if models else None
    if best is None or scored[0][1] == "raw":
        found = "" if not models else f"; the best calibration, {best}, {models[0][0].rmse:.3g}"
        return (
            None,
            best,
            (
                f"nothing beats the raw readings on validation sensor {sensor}: raw RMSE "
                f"{raw.rmse:.3g} µg/m³ over {raw.n} windows{found}. `export` writes no model "
                "unless --force: collect more co-location (or other channels) and train again"
            ),
        )
    others = ", ".join(f"{name} {metrics.rmse:.3g}" for metrics, name in scored[1:])
    return (
        best,
        best,
        (
            f"{best} has the lowest RMSE on validation sensor {sensor}: {scored[0][0].rmse:.3g} "
            f"µg/m³ over {raw.n} windows, against {others}"
        ),
    )


def fit_ladder(config: TrainConfig, run_dir: Path, tesla_runs: Mapping[str, Path]) -> Ladder:
    """Fit the classical candidates, score them beside the TESLA runs, write ``ladder.json``."""
    data = LadderData(config)
    wide = _wide_channels(data)
    validation, test = data.windows(wide, "validation"), data.windows(wide, "test")
    if len(validation) == 0:
        raise DataError(f"no validation windows of N={config.window_length} for the ladder")
    candidates = [
        CandidateScore(
            name="raw",
            architecture="none",
            input_channels=["raw"],
            parameters=0,
            validation=_score(validation.current_raw(), validation),
            test=_score(test.current_raw(), test),
            note="the readings as they are",
        )
    ]
    classical, fits = _classical_candidates(data, wide, validation, test)
    candidates += classical
    runs: dict[str, str] = {}
    for name, run in tesla_runs.items():
        runs[name] = str(run.relative_to(run_dir)) if run != run_dir else "."
        candidates.append(_tesla_candidate(name, run, validation, test))
    winner, best, reason = choose(tuple(candidates), data.split.validation)
    ladder = Ladder(tuple(candidates), winner, best, reason, fits, runs)
    (run_dir / LADDER_FILENAME).write_text(
        json.dumps(ladder.as_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return ladder


def load_ladder(run_dir: Path) -> Ladder | None:
    """The run's ladder, or None for a run trained before the ladder existed."""
    path = run_dir / LADDER_FILENAME
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        return Ladder(
            candidates=tuple(CandidateScore.model_validate(c) for c in payload["candidates"]),
            winner=payload["winner"],
            best_model=payload["best_model"],
            reason=payload["reason"],
            fits={n: ClassicalFit.from_dict(f) for n, f in payload["fits"].items()},
            runs=dict(payload["runs"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RunDirError(f"{path}: {exc}; train again to rewrite the ladder") from exc
