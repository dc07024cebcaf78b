"""Golden windows: a few input windows and the outputs the release tool computed for them.

``training/release.py`` runs the float graph under LiteRT on a handful of windows spread over
the model's training input range and signs the result into the release as ``golden.json``.
Before a gateway makes a staged release current it runs the same windows through the real
Calibrator (one batched invoke) and requires every output to agree within
``GOLDEN_ABS_TOLERANCE + GOLDEN_REL_TOLERANCE * |expected|``: a FlatBuffer that loads but
computes something else (the wrong weights under a valid signature) is refused. Releases made
before golden windows existed carry none and are checked by load and test invoke only.

Agreeing with its own golden windows proves the graph is the one released, not that it is
sane: a release tool signs whatever the graph computes. :func:`check_plausible` therefore also
holds the outputs on those windows (or, without golden windows, on constant windows at the
training inputs' p01, p50 and p99) to the bound every published value meets at run time
(tesla_gateway/models/plausibility.py): a model that answers raw 20 µg/m³ with -10,770 is
refused before it serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tesla_gateway.contract.time_of_day import neutral_hours
from tesla_gateway.ota.errors import (
    GoldenMismatchError,
    ImplausibleReleaseError,
    MalformedReleaseError,
)

if TYPE_CHECKING:
    from tesla_gateway.contract.manifest import Manifest
    from tesla_gateway.models.plausibility import PlausibleRange

__all__ = [
    "GOLDEN_ABS_TOLERANCE",
    "GOLDEN_FILENAME",
    "GOLDEN_REL_TOLERANCE",
    "GoldenWindows",
    "check_golden",
    "check_plausible",
    "parse_golden",
]

GOLDEN_FILENAME = "golden.json"
# Outputs are in µg/m³. The same graph under another LiteRT build, thread count or batch size
# differs by float rounding only (measured: docs/ota-protocol.md, "Golden windows"); a wrong
# graph differs by whole µg/m³.
GOLDEN_ABS_TOLERANCE = 1e-3
GOLDEN_REL_TOLERANCE = 1e-4


class _Runs(Protocol):
    """What :func:`check_golden` needs of a Calibrator."""

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    def calibrate(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...


class _Bounded(_Runs, Protocol):
    """What :func:`check_plausible` needs of a Calibrator."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def plausible(self) -> PlausibleRange: ...


class GoldenWindows(BaseModel):
    """The content of ``golden.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = 1
    runtime: str = Field(description="Interpreter and version that computed ``expected``.")
    windows: list[list[float]] | list[list[list[float]]] = Field(
        min_length=1, max_length=64, description="Input windows, [B, N] or [B, N, C], raw units."
    )
    expected: list[float] = Field(min_length=1, max_length=64, description="Outputs, [B].")


def parse_golden(data: bytes) -> GoldenWindows:
    try:
        golden = GoldenWindows.model_validate_json(data)
    except ValidationError as exc:
        raise MalformedReleaseError(f"{GOLDEN_FILENAME} is not valid: {exc}") from exc
    if len(golden.windows) != len(golden.expected):
        raise MalformedReleaseError(
            f"{GOLDEN_FILENAME} has {len(golden.windows)} windows but "
            f"{len(golden.expected)} expected outputs"
        )
    return golden


def check_golden(calibrator: _Runs, golden: GoldenWindows) -> float:
    """Run the golden windows; return the largest deviation or raise GoldenMismatchError."""
    windows = np.asarray(golden.windows, dtype=np.float32)
    if windows.shape[1:] != calibrator.input_shape:
        raise GoldenMismatchError(
            f"golden windows have shape {list(windows.shape[1:])}, the model takes "
            f"{list(calibrator.input_shape)}: the release is inconsistent; re-create it"
        )
    expected = np.asarray(golden.expected, dtype=np.float64)
    got = calibrator.calibrate(windows).astype(np.float64)
    deviation = np.abs(got - expected)
    allowed = GOLDEN_ABS_TOLERANCE + GOLDEN_REL_TOLERANCE * np.abs(expected)
    bad = ~(deviation <= allowed)  # NaN counts as a mismatch
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise GoldenMismatchError(
            f"the staged model gives {got[row]:.6g} for golden window {row}, the release "
            f"expects {expected[row]:.6g} ({golden.runtime}; {int(bad.sum())} of "
            f"{len(expected)} windows off by more than {GOLDEN_ABS_TOLERANCE} + "
            f"{GOLDEN_REL_TOLERANCE} x |expected|): the FlatBuffer is not the model that was "
            "released; re-create the release from the right model directory"
        )
    return float(deviation.max())


def check_plausible(calibrator: _Bounded, golden: GoldenWindows | None) -> None:
    """Run the reference windows; raise ImplausibleReleaseError if any output is out of bounds.

    The windows are the golden ones when the release has them, else constant windows at the
    training inputs' p01, p50 and p99 (every channel at that value, as the load's test invoke).
    """
    if golden is not None:
        windows = np.asarray(golden.windows, dtype=np.float32)
        what = "golden window"
    else:
        span = calibrator.manifest.input_range
        levels = np.asarray([span.p01, span.p50, span.p99], dtype=np.float32)
        shape = calibrator.input_shape
        windows = np.broadcast_to(levels.reshape(-1, *([1] * len(shape))), (3, *shape)).copy()
        neutral_hours(windows, calibrator.manifest.channel_names)
        what = "constant window (training input p01, p50, p99)"
    if windows.shape[1:] != calibrator.input_shape:
        raise ImplausibleReleaseError(  # check_golden reports this first when golden is given
            f"reference windows of shape {list(windows.shape[1:])} for a model taking "
            f"{list(calibrator.input_shape)}"
        )
    last = windows[:, -1] if windows.ndim == 2 else windows[:, -1, 0]  # [B] the newest raw
    outputs = calibrator.calibrate(windows).astype(np.float64)
    bad = calibrator.plausible.implausible(outputs, last)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ImplausibleReleaseError(
            f"the model's output for {what} {row} (newest raw {float(last[row]):.4g} µg/m³) is "
            f"implausible: {calibrator.plausible.reason(float(outputs[row]), float(last[row]))}"
            f" ({int(bad.sum())} of {len(outputs)} reference windows); the manifest's own "
            "training range and intervals say no concentration could be that: check the "
            "training run and the export before releasing it again"
        )
