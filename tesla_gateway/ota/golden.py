"""Golden windows: a few input windows and the outputs the release tool computed for them.

``training/release.py`` runs the float graph under LiteRT on a handful of windows spread over
the model's training input range and signs the result into the release as ``golden.json``.
Before a gateway makes a staged release current it runs the same windows through the real
Calibrator (one batched invoke) and requires every output to agree within
``GOLDEN_ABS_TOLERANCE + GOLDEN_REL_TOLERANCE * |expected|``: a FlatBuffer that loads but
computes something else (the wrong weights under a valid signature) is refused. Releases made
before golden windows existed carry none and are checked by load and test invoke only.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tesla_gateway.ota.errors import GoldenMismatchError, MalformedReleaseError

__all__ = [
    "GOLDEN_ABS_TOLERANCE",
    "GOLDEN_FILENAME",
    "GOLDEN_REL_TOLERANCE",
    "GoldenWindows",
    "check_golden",
    "parse_golden",
]

GOLDEN_FILENAME = "golden.json"
# Outputs are in ug/m3. The same graph under another LiteRT build, thread count or batch size
# differs by float rounding only (measured: docs/ota-protocol.md, "Golden windows"); a wrong
# graph differs by whole ug/m3.
GOLDEN_ABS_TOLERANCE = 1e-3
GOLDEN_REL_TOLERANCE = 1e-4


class _Runs(Protocol):
    """What :func:`check_golden` needs of a Calibrator."""

    @property
    def input_shape(self) -> tuple[int, ...]: ...

    def calibrate(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...


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
