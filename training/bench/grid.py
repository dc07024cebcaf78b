"""What a benchmark computes: the model names, the budget, and the cells of the grid.

A *cell* is one (model, dataset, N, seed): one training run, evaluated on the dataset's test
sensor, exported and measured. Model names are TESLA, the paper's seven baselines, TESLA's
ablation variants and covariate variants (configurations of the one :class:`TeslaConfig` and of
:class:`TrainConfig`, not copies), and the reference calibrations ``raw``, ``ols`` and ``epa``.

The paper's "Linear" baseline (LTSF-Linear over the window) is ``linear``; the practitioners'
linear calibration (OLS on the current reading) is the reference row ``ols``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tesla_gateway.contract.readings import Feature
from training.data import DATASET_NAMES
from training.errors import TrainingError
from training.models import (
    BASELINE_KINDS,
    AnyModelConfig,
    DLinearConfig,
    InformerConfig,
    ITransformerConfig,
    LinearConfig,
    NLinearConfig,
    PatchTSTConfig,
    TeslaConfig,
    TransformerConfig,
)

__all__ = [
    "ABLATION_CHAIN",
    "ABLATION_MODELS",
    "COVARIATE_MODELS",
    "MODELS",
    "PAPER_MODELS",
    "REFERENCE_MODELS",
    "BenchConfig",
    "BenchConfigError",
    "Cell",
    "DatasetSpec",
    "ModelEntry",
    "SweepConfig",
    "load_bench_config",
]

Group = Literal["reference", "paper", "ablation", "covariate"]


class BenchConfigError(TrainingError):
    """The benchmark's budget or grid is invalid; the message names the field to fix."""


@dataclass(frozen=True)
class ModelEntry:
    """A name in the grid: a learned model (config + input channels) or a reference row."""

    name: str
    group: Group
    description: str
    model: AnyModelConfig | None = None  # None: a reference calibration, nothing to train
    channels: tuple[str, ...] = ("raw",)

    @property
    def learned(self) -> bool:
        return self.model is not None


_TESLA = TeslaConfig()

_ENTRIES = (
    ModelEntry("raw", "reference", "uncalibrated low-cost reading"),
    ModelEntry("ols", "reference", "linear calibration: OLS on the current reading"),
    ModelEntry("epa", "reference", "US EPA PurpleAir correction (PM2.5 with RH only)"),
    ModelEntry("linear", "paper", "LTSF-Linear over the window", LinearConfig()),
    ModelEntry("nlinear", "paper", "NLinear", NLinearConfig()),
    ModelEntry("dlinear", "paper", "DLinear", DLinearConfig()),
    ModelEntry("transformer", "paper", "vanilla Transformer encoder", TransformerConfig()),
    ModelEntry("informer", "paper", "Informer (ProbSparse, distilling)", InformerConfig()),
    ModelEntry("patchtst", "paper", "PatchTST (patch 16, stride 8)", PatchTSTConfig()),
    ModelEntry("itransformer", "paper", "iTransformer", ITransformerConfig()),
    ModelEntry("tesla", "paper", "TESLA", _TESLA),
    ModelEntry(
        "tesla-uniform-bins",
        "ablation",
        "TESLA with uniform instead of log bins",
        _TESLA.model_copy(update={"bins": "uniform"}),
    ),
    ModelEntry(
        "tesla-local-only",
        "ablation",
        "TESLA without the global embedding",
        _TESLA.model_copy(update={"use_global": False}),
    ),
    ModelEntry(
        "tesla-ffn-aggregator",
        "ablation",
        "TESLA with a feed-forward head instead of the linear aggregator",
        _TESLA.model_copy(update={"aggregator": "ffn"}),
    ),
    ModelEntry(
        "tesla-local-ffn",
        "ablation",
        "log bins, local embedding, feed-forward head (paper Table 2, row 3)",
        _TESLA.model_copy(update={"use_global": False, "aggregator": "ffn"}),
    ),
    ModelEntry(
        "tesla-uniform-local-ffn",
        "ablation",
        "uniform bins, local embedding, feed-forward head (paper Table 2, row 2)",
        _TESLA.model_copy(update={"bins": "uniform", "use_global": False, "aggregator": "ffn"}),
    ),
    ModelEntry("tesla+rh", "covariate", "TESLA with relative humidity", _TESLA, ("raw", "rh")),
    ModelEntry(
        "tesla+rh+t",
        "covariate",
        "TESLA with relative humidity and temperature",
        _TESLA,
        ("raw", "rh", "temp_c"),
    ),
)
MODELS: dict[str, ModelEntry] = {entry.name: entry for entry in _ENTRIES}
REFERENCE_MODELS = tuple(e.name for e in _ENTRIES if e.group == "reference")
PAPER_MODELS = (*BASELINE_KINDS, "tesla")
ABLATION_MODELS = tuple(e.name for e in _ENTRIES if e.group == "ablation")
COVARIATE_MODELS = tuple(e.name for e in _ENTRIES if e.group == "covariate")
# The paper's Table 2, cumulative: Transformer, then TESLA's three changes one after another.
ABLATION_CHAIN = (
    ("transformer", "full", "local", "feed-forward"),
    ("tesla-uniform-local-ffn", "binned (uniform)", "local", "feed-forward"),
    ("tesla-local-ffn", "binned (log)", "local", "feed-forward"),
    ("tesla-ffn-aggregator", "binned (log)", "local+global", "feed-forward"),
    ("tesla", "binned (log)", "local+global", "linear"),
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSpec(_Strict):
    """One co-location dataset: gives the grid one (region, feature)."""

    dataset: str = Field(description="Name in training.data's registry, e.g. 'ispra-1min'.")
    id: str | None = Field(
        default=None, description="Unique label for files; default: the dataset name."
    )
    region: str | None = Field(
        default=None, description="Region label in the tables; default: the name before '-'."
    )
    data_path: Path | None = Field(default=None, description="Folder or file; default: shared.")
    options: dict[str, int | float | str] = Field(
        default_factory=dict, description="Loader options, e.g. {'feature': 'pm10'}."
    )
    max_interpolated_periods: int = Field(
        default=30, ge=0, description="Gap policy: longest gap filled (30 min for 1-min data)."
    )

    @field_validator("dataset")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {value!r}; choose from {', '.join(DATASET_NAMES)}")
        return value

    @property
    def key(self) -> str:
        return self.id or self.dataset

    @property
    def region_label(self) -> str:
        return self.region or self.dataset.split("-")[0]


class SweepConfig(_Strict):
    """The window sweep (paper Figure 6): RMSE and FLOPs of some models over several N."""

    enabled: bool = True
    windows: tuple[int, ...] = Field(
        default=(15, 60, 360, 720, 1440), description="Window lengths N to train at."
    )
    models: tuple[str, ...] = Field(
        default=("dlinear", "transformer", "tesla"),
        description="The paper sweeps its most complex linear and Transformer models and TESLA.",
    )
    measure: Literal["float", "full"] = Field(
        default="float",
        description=(
            "'float': sweep cells off the main N export only the float FlatBuffer (FLOPs, size, "
            "latency); 'full' also builds, verifies and measures the device graph."
        ),
    )

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(n < 2 for n in value) or len(set(value)) != len(value):
            raise ValueError(f"sweep windows must be distinct integers >= 2, got {value}")
        return tuple(sorted(value))


class BenchConfig(_Strict):
    """The benchmark's grid and budget; defaults are the paper's protocol on Ispra PM10."""

    datasets: tuple[DatasetSpec, ...] = Field(
        default=(DatasetSpec(dataset="ispra-1min"),), description="Regions × features to run."
    )
    features: tuple[Feature, ...] | None = Field(
        default=None, description="Keep only datasets of these features (default: all)."
    )
    models: tuple[str, ...] = Field(
        default=PAPER_MODELS, description="Learned models at the main N (see MODELS)."
    )
    ablations: bool = Field(default=True, description="Add TESLA's ablation variants.")
    covariates: bool = Field(default=True, description="Add tesla+rh and tesla+rh+t.")
    epa: bool = Field(default=True, description="Add the EPA row where it applies.")
    window_length: int = Field(default=360, ge=2, description="Main N (paper: 360).")
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    epochs: int = Field(default=10, ge=1, description="Paper: 10.")
    batch_size: int = Field(default=32, ge=1, description="Paper: 32.")
    learning_rate: float = Field(default=1e-3, gt=0)
    early_stopping_patience: int = Field(default=3, ge=1)
    seeds: tuple[int, ...] = Field(default=(0,), description="One run per seed; mean reported.")
    max_train_windows: int | None = Field(
        default=None, ge=1, description="Cap on training windows per run (random subset)."
    )
    case_study_models: tuple[str, ...] = Field(
        default=("dlinear", "itransformer", "tesla"),
        description="Models drawn in the case-study plot (paper Figure 7).",
    )
    case_study_periods: int = Field(
        default=360, ge=10, description="Length of each case-study period, in grid periods."
    )

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or len(set(value)) != len(value):
            raise ValueError(f"seeds must be distinct and at least one, got {value}")
        return value

    @field_validator("models", "case_study_models")
    @classmethod
    def _learned_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        learned = [name for name, entry in MODELS.items() if entry.learned]
        for name in value:
            if name in REFERENCE_MODELS:
                raise ValueError(
                    f"{name!r} is a reference row, always included (epa: the 'epa' flag)"
                )
            if name not in MODELS:
                raise ValueError(f"unknown model {name!r}; choose from {', '.join(learned)}")
        if len(set(value)) != len(value):
            raise ValueError(f"model names repeat: {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BenchConfig:
        if not self.datasets:
            raise ValueError("datasets: give at least one dataset")
        keys = [spec.key for spec in self.datasets]
        if len(set(keys)) != len(keys):
            raise ValueError(f"datasets: ids must be unique (set 'id'), got {keys}")
        if not self.grid_models:
            raise ValueError("models: the grid has no learned model")
        for name in self.sweep.models:
            if name not in MODELS or not MODELS[name].learned:
                raise ValueError(f"sweep.models: {name!r} is not a learned model")
        return self

    @property
    def grid_models(self) -> tuple[str, ...]:
        """Learned models at the main N, in table order (the ablation chain needs Transformer)."""
        names = list(self.models)
        if self.ablations:
            names += ["transformer", *ABLATION_MODELS, "tesla"]
        if self.covariates:
            names += list(COVARIATE_MODELS)
        return tuple(dict.fromkeys(names))

    @property
    def sweep_windows(self) -> tuple[int, ...]:
        return self.sweep.windows if self.sweep.enabled else ()

    def reference_cells(self, spec: DatasetSpec) -> tuple[Cell, ...]:
        """The reference rows of one dataset at the main N: raw, ols and (if asked) epa."""
        names = REFERENCE_MODELS if self.epa else ("raw", "ols")
        return tuple(Cell(spec.key, name, self.window_length, None) for name in names)

    def cells(self, spec: DatasetSpec) -> Iterator[Cell]:
        """Every learned cell of one dataset: the main grid, then the sweep (shared cells once)."""
        seen: set[tuple[str, int, int]] = set()
        plan = [(name, self.window_length, True) for name in self.grid_models]
        plan += [(name, n, False) for n in self.sweep_windows for name in self.sweep.models]
        for name, n, main in plan:
            for seed in self.seeds:
                if (name, n, seed) in seen:
                    continue
                seen.add((name, n, seed))
                full = main or n == self.window_length or self.sweep.measure == "full"
                yield Cell(dataset=spec.key, model=name, window_length=n, seed=seed, full=full)


@dataclass(frozen=True)
class Cell:
    """One (dataset, model, N, seed) of the grid; ``full``: export and measure the device graph."""

    dataset: str
    model: str
    window_length: int
    seed: int | None  # None for the reference rows (nothing random)
    full: bool = True

    @property
    def file_name(self) -> str:
        seed = "ref" if self.seed is None else f"seed{self.seed}"
        return f"{self.dataset}__N{self.window_length}__{self.model}__{seed}.json"

    @property
    def label(self) -> str:
        seed = "" if self.seed is None else f" seed {self.seed}"
        return f"{self.dataset} N={self.window_length} {self.model}{seed}"


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "config"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def load_bench_config(payload: dict[str, object] | Path) -> BenchConfig:
    """Validate a benchmark config (a dict or a JSON file) with an actionable message."""
    if isinstance(payload, Path):
        try:
            payload = json.loads(payload.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise BenchConfigError(f"cannot read the bench config {payload}: {exc}") from exc
    try:
        return BenchConfig.model_validate(payload)
    except ValidationError as exc:
        raise BenchConfigError(f"invalid bench config: {_describe(exc)}") from exc
