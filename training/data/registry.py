"""Datasets by name, so commands and configs say ``ispra-1min`` instead of wiring loaders."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from training.data.antwerp import load_antwerp
from training.data.frame import CoLocationData
from training.data.ispra import load_ispra
from training.data.pairs import load_pairs
from training.data.plain_csv import load_plain_csv
from training.data.senseurcity import load_senseurcity
from training.data.synthetic import generate_synthetic
from training.errors import DataError

__all__ = ["DATASET_NAMES", "DATA_DIR_ENV", "default_data_dir", "load_dataset"]

DATA_DIR_ENV = "TESLA_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _ispra(path: Path, **options: Any) -> CoLocationData:
    return load_ispra(path, target="station", **options)


def _ispra_opcn3(path: Path, **options: Any) -> CoLocationData:
    return load_ispra(path, target="opcn3", **options)


def _antwerp_pm2_5(path: Path, **options: Any) -> CoLocationData:
    return load_antwerp(path, feature="pm2_5", **options)


def _antwerp_pm10(path: Path, **options: Any) -> CoLocationData:
    return load_antwerp(path, feature="pm10", **options)


# name -> (loader, sub-directory of the shared data folder or None when a path is required,
#          the public function whose options apply, its parameters the name already fixes)
_Loader = Callable[..., CoLocationData]
_DATASETS: Mapping[str, tuple[_Loader, str | None, _Loader, frozenset[str]]] = MappingProxyType(
    {
        "ispra-1min": (_ispra, "ispra-1min", load_ispra, frozenset({"directory", "target"})),
        "ispra-1min-opcn3": (
            _ispra_opcn3,
            "ispra-1min",
            load_ispra,
            frozenset({"directory", "target"}),
        ),
        "antwerp-hourly-pm2_5": (
            _antwerp_pm2_5,
            "antwerp-hourly",
            load_antwerp,
            frozenset({"directory", "feature"}),
        ),
        "antwerp-hourly-pm10": (
            _antwerp_pm10,
            "antwerp-hourly",
            load_antwerp,
            frozenset({"directory", "feature"}),
        ),
        "senseurcity": (load_senseurcity, None, load_senseurcity, frozenset({"paths"})),
        "csv": (load_plain_csv, None, load_plain_csv, frozenset({"path"})),
        "pairs": (load_pairs, None, load_pairs, frozenset({"path"})),
    }
)
DATASET_NAMES: tuple[str, ...] = (*_DATASETS, "synthetic")


def default_data_dir() -> Path:
    """``$TESLA_DATA_DIR`` if set, else ``../shared/data`` beside the repository root."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured)
    return _REPO_ROOT.parent / "shared" / "data"


def load_dataset(name: str, path: Path | None = None, **options: Any) -> CoLocationData:
    """Load a dataset by name; ``path`` overrides the default location (required for csv and
    senseurcity, not accepted for synthetic)."""
    if name == "synthetic":
        if path is not None:
            raise DataError("the synthetic dataset is generated, it takes no path")
        _check_options(name, generate_synthetic, options, fixed=frozenset())
        return generate_synthetic(**options)
    if name not in _DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    loader, subdirectory, public, fixed = _DATASETS[name]
    _check_options(name, public, options, fixed=fixed)
    if path is None:
        if subdirectory is None:
            raise DataError(f"dataset {name!r} needs a path to the data")
        path = default_data_dir() / subdirectory
        if not path.is_dir():
            raise DataError(
                f"dataset {name!r} not found at {path}; pass a path or set {DATA_DIR_ENV}"
            )
    return loader(Path(path), **options)


def _check_options(
    name: str, function: Callable[..., Any], options: Mapping[str, Any], *, fixed: frozenset[str]
) -> None:
    accepted = set(inspect.signature(function).parameters) - fixed
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise DataError(
            f"dataset {name!r} does not take option(s) {unknown}; it accepts {sorted(accepted)}"
        )
