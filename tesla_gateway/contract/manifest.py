"""The model manifest: the contract between training, the gateway and the node firmware.

A model directory holds ``manifest.json`` beside the FlatBuffers it describes. Training writes it
(importing this module), the gateway and the OTA path read and verify it, and the firmware's
constants are generated from it. The schema is strict (``extra="forbid"``) so that a field added
on one side and not the other fails loudly instead of being ignored.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import tempfile
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tesla_gateway.contract.intervals import PredictionIntervals, UnitCoverage
from tesla_gateway.contract.readings import Feature
from tesla_gateway.contract.sensor_kind import SensorKind
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.errors import ManifestError, ModelIntegrityError

__all__ = [
    "MANIFEST_FILENAME",
    "MODEL_NAME_PATTERN",
    "CandidateScore",
    "DataSummary",
    "ErrorMetrics",
    "HistoryIntervals",
    "HistoryPoint",
    "InputChannel",
    "InputRange",
    "Manifest",
    "ModelFile",
    "PredictionIntervals",
    "TargetRange",
    "TestMetrics",
    "TrainedEpochs",
    "UnitCoverage",
    "load_manifest",
    "sha256_file",
    "verify_model_files",
    "write_manifest",
]

MANIFEST_FILENAME = "manifest.json"
SCHEMA_VERSION: Literal[1] = 1

Precision = Literal["float32", "int8"]
# A model name: in directory names, topics and logs (training checks it before an export starts).
MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
# An absolute POSIX path inside a text: '/' not preceded by a name character, up to a separator.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s:,;]+")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputChannel(_Strict):
    """One input channel of the window, in the order the model expects them."""

    name: str = Field(description="Reading field feeding this channel, e.g. 'pm10' or 'rh'.")
    unit: str = Field(description="Unit the model expects, e.g. 'ug/m3', '%', 'degC'.")


class ModelFile(_Strict):
    """One FlatBuffer in the model directory."""

    path: str = Field(description="File name relative to the model directory.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(gt=0)
    precision: Precision
    batch: Literal["dynamic", 1] = Field(
        description="'dynamic' for the gateway's batched graph; 1 for the fixed-shape device graph."
    )
    activations: Literal["float32", "int8", "int16"] = Field(
        default="float32",
        description="Activation type; the device file is 8-bit weights with 16-bit activations.",
    )
    ops: list[str] = Field(description="Builtin operators the graph uses, sorted.")
    tflm_arena_bytes: int | None = Field(
        default=None, description="TFLite Micro arena measured for this file, if it runs there."
    )
    input_scale: float | None = Field(default=None, description="Integer input quantisation scale.")
    input_zero_point: int | None = None
    output_scale: float | None = Field(
        default=None, description="Integer output quantisation scale."
    )
    output_zero_point: int | None = None

    @field_validator("path")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if Path(value).name != value or value in {"", ".", ".."}:
            raise ValueError(f"must be a plain file name inside the model directory, got {value!r}")
        return value


class ErrorMetrics(_Strict):
    """Accuracy over ``n`` calibrated periods, in the feature's unit."""

    rmse: float = Field(ge=0)
    mae: float = Field(ge=0)
    n: int = Field(ge=0)


class TestMetrics(_Strict):
    """Scores on the test sensor: uncalibrated, a linear fit, and this model."""

    raw: ErrorMetrics
    linear: ErrorMetrics
    model: ErrorMetrics


class InputRange(_Strict):
    """Where the training inputs lay, so the gateway can tell when a sensor leaves the domain."""

    min: float
    p01: float
    p50: float
    p99: float
    max: float


class TargetRange(InputRange):
    """Where the training windows' reference values lay: what the model learned to output.

    The gateway bounds every output by it (tesla_gateway/models/plausibility.py)."""


class HistoryPoint(_Strict):
    """Accuracy on the validation sensor when every window has only its newest ``periods``
    periods (the older ones edge-padded, as the gateway pads a young sensor's window)."""

    periods: int = Field(ge=1, description="K: periods of history each window kept.")
    model: ErrorMetrics
    linear: ErrorMetrics | None = Field(
        default=None, description="The linear fit on the same windows (it reads only the newest)."
    )


class HistoryIntervals(_Strict):
    """Prediction intervals for windows with at least ``min_periods`` periods of history (up to
    the next entry's), fitted on validation windows truncated to ``min_periods``: the shortest
    history of the bucket, whose errors are the widest, so the bucket's coverage is kept."""

    min_periods: int = Field(ge=1)
    intervals: PredictionIntervals


class CandidateScore(_Strict):
    """One calibration ``train`` fitted and compared before export (the raw readings, the
    classical fits, TESLA from scratch or fine-tuned), scored on the same validation windows."""

    name: str = Field(description="'raw', 'linear', 'multilinear', 'growth', 'tesla', ...")
    architecture: str = Field(description="The manifest architecture it exports as.")
    input_channels: list[str] = Field(description="Channels it reads, the reading first.")
    parameters: int = Field(ge=0)
    validation: ErrorMetrics | None = Field(
        default=None, description="On the validation sensor; None when it was not fitted."
    )
    test: ErrorMetrics | None = Field(default=None, description="On the test sensor (reported).")
    note: str | None = Field(default=None, description="Why it was not fitted, or how it was.")


class TrainedEpochs(_Strict):
    """The epochs and seed the exported weights come from: what retraining a peer of the model
    needs (``calibrate-intervals``' folds train for exactly these) once the run is gone."""

    epochs: int = Field(
        ge=1, description="Training epochs the weights are from (early stopping's best epoch)."
    )
    fine_tune_epochs: int = Field(
        default=0, ge=0, description="Short-history fine-tuning epochs kept after them (0: none)."
    )
    seed: int = Field(description="The training seed.")


class DataSummary(_Strict):
    """Where the training data came from and how much of it survived cleaning."""

    source: str = Field(
        description=(
            "Dataset, loader and data folder, e.g. 'ispra-1min:ispra-1min:ispra-1min'; an "
            "absolute path is kept as its last component (the builder's folders mean nothing "
            "where the model runs)."
        )
    )
    target: str = Field(description="Reference column the model learned to reproduce.")
    train_sensors: list[str]
    validation_sensor: str
    test_sensor: str
    rows_read: int = Field(ge=0)
    rows_dropped: dict[str, int] = Field(description="Dropped rows by reason.")
    sensors_dropped: list[str] = Field(default_factory=list)
    windows: dict[str, int] = Field(description="Valid windows per split.")
    attribution: str

    @field_validator("source")
    @classmethod
    def _without_builder_paths(cls, value: str) -> str:
        return _ABSOLUTE_PATH.sub(lambda match: PurePosixPath(match.group()).name, value)


class Manifest(_Strict):
    """What a runtime needs to run a model correctly and a person needs to trust it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str = Field(pattern=MODEL_NAME_PATTERN, description="Model family name.")
    version: int = Field(
        ge=1, lt=2**32, description="Monotonic release number; updates must carry a larger one."
    )
    architecture: str = Field(
        description=(
            "Model builder, e.g. 'tesla' or 'linear'; the calibrations practitioners use, which "
            "read only the newest period, are 'classical-linear', 'classical-multilinear' and "
            "'classical-growth' (training/classical.py). The gateway runs every one alike."
        )
    )
    feature: Feature
    unit: Literal["ug/m3"] = "ug/m3"
    window_length: int = Field(ge=1, le=100_000, description="N: periods in one window.")
    period_seconds: int = Field(ge=1, description="Grid period: 60 for the paper's setting.")
    input_channels: list[InputChannel] = Field(min_length=1)
    input_order: Literal["oldest_first"] = "oldest_first"
    input_scale: float = Field(
        gt=0, description="Divisor applied to inputs inside the graph (informational)."
    )
    gap_policy: GapPolicy
    files: dict[Precision, ModelFile]
    parameter_count: int = Field(ge=0)
    hyperparameters: dict[str, float | int | str | bool]
    validation: ErrorMetrics
    test: TestMetrics
    input_range: InputRange
    data: DataSummary
    created_at: datetime
    intervals: PredictionIntervals | None = Field(
        default=None, description="Prediction intervals published with each calibrated value."
    )
    validation_baselines: TestMetrics | None = Field(
        default=None,
        description="Raw, linear and model scores on the validation sensor (export's harm check).",
    )
    target_range: TargetRange | None = Field(
        default=None,
        description=(
            "Percentiles of the training windows' reference values; absent in manifests written "
            "before it existed (the gateway then bounds outputs by input_range)."
        ),
    )
    device_graph_absent: str | None = Field(
        default=None,
        description="Why the model has no int8 device graph (release/firmware quote it).",
    )
    sensor: SensorKind | None = Field(
        default=None,
        description=(
            "The low-cost sensor and value set the model was trained on, e.g. PMS5003 'atm'; "
            "sources delivering another are refused at start. Absent in manifests written "
            "before it existed (nothing is checked then)."
        ),
    )
    min_history_periods: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Periods of history from which the model calibrates, the older part of the window "
            "edge-padded (tesla_gateway/contract/series.py); absent: the whole window_length."
        ),
    )
    history_curve: list[HistoryPoint] | None = Field(
        default=None,
        description="Validation RMSE per history length: how the error grows as history shrinks.",
    )
    history_intervals: list[HistoryIntervals] | None = Field(
        default=None,
        description=(
            "Intervals for short histories, by ascending min_periods; windows of N periods (and "
            "any history past the last entry's bucket) take ``intervals``."
        ),
    )
    trained_epochs: TrainedEpochs | None = Field(
        default=None,
        description=(
            "The epochs and seed the weights come from; absent in manifests written before it "
            "existed and for weights not trained from scratch (fine-tuned, retrained, classical)."
        ),
    )
    # bounded far above what train writes (6 candidates, a sentence): reports, not payloads
    candidates: list[CandidateScore] | None = Field(
        default=None,
        max_length=32,
        description="Every calibration train compared on the validation sensor (absent before).",
    )
    choice: str | None = Field(
        default=None,
        max_length=2000,
        description="Why this calibration was exported rather than the others.",
    )

    @field_validator("input_channels")
    @classmethod
    def _unique_channels(cls, value: list[InputChannel]) -> list[InputChannel]:
        names = [channel.name for channel in value]
        if len(set(names)) != len(names):
            raise ValueError(f"channel names must be unique, got {names}")
        return value

    @model_validator(mode="after")
    def _history_fits_window(self) -> Manifest:
        if self.min_history_periods is not None and self.min_history_periods > self.window_length:
            raise ValueError(
                f"min_history_periods {self.min_history_periods} exceeds window_length "
                f"{self.window_length}"
            )
        buckets = [entry.min_periods for entry in self.history_intervals or []]
        if any(b <= a for a, b in itertools.pairwise(buckets)) or any(
            k > self.window_length for k in buckets
        ):
            raise ValueError(
                f"history_intervals min_periods must ascend within 1..{self.window_length}, "
                f"got {buckets}"
            )
        return self

    @property
    def channel_names(self) -> tuple[str, ...]:
        return tuple(channel.name for channel in self.input_channels)

    @property
    def calibrates_from(self) -> int:
        """Periods of history a sensor needs before the model calibrates it."""
        return self.window_length if self.min_history_periods is None else self.min_history_periods

    def intervals_for(self, history_periods: int) -> PredictionIntervals | None:
        """The intervals for a window with ``history_periods`` periods of real history: the
        bucket holding it (the first, widest, below every bucket), or ``intervals`` for a whole
        window or a model without buckets."""
        buckets = self.history_intervals
        if history_periods >= self.window_length or not buckets:
            return self.intervals
        chosen = buckets[0].intervals
        for entry in buckets[1:]:
            if entry.min_periods <= history_periods:
                chosen = entry.intervals
        return chosen


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so large files do not sit in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_manifest(model_dir: Path) -> Manifest:
    """Read and validate ``manifest.json``; every problem becomes a :class:`ManifestError`."""
    path = model_dir / MANIFEST_FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} does not exist: is {model_dir} a model directory?") from exc
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ManifestError(f"{path} is not a valid manifest: {problems}") from exc


def verify_model_files(model_dir: Path, manifest: Manifest) -> None:
    """Check every listed file exists with the recorded size and sha256."""
    for precision, entry in manifest.files.items():
        path = model_dir / entry.path
        if not path.is_file():
            raise ModelIntegrityError(f"{precision} model {path} is missing")
        size = path.stat().st_size
        if size != entry.size_bytes:
            raise ModelIntegrityError(
                f"{path} has {size} bytes, the manifest says {entry.size_bytes}: file is corrupt"
            )
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise ModelIntegrityError(
                f"{path} sha256 {actual[:12]}… does not match the manifest's {entry.sha256[:12]}…: "
                "the file is corrupt or was replaced; re-copy the whole model directory"
            )


def write_manifest(model_dir: Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temp file, fsync, rename)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / MANIFEST_FILENAME
    payload = json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    handle, temp_name = tempfile.mkstemp(dir=model_dir, prefix=".manifest-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp creates 0600; a model directory is read by the daemon's own user.
        Path(temp_name).chmod(0o644)
        Path(temp_name).replace(target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return target
