"""A verified model ready to calibrate batches of windows.

:meth:`Calibrator.load` refuses anything it cannot vouch for: the manifest must validate, every
file must match its sha256, the float32 graph must take ``[batch, N]`` windows and return one
value each, and a test invoke on a constant window at the training median must give a finite
number. Only then does the gateway put the model in service.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.manifest import Manifest, load_manifest, verify_model_files
from tesla_gateway.contract.time_of_day import neutral_hours
from tesla_gateway.errors import GatewayError, ModelIntegrityError, ModelLoadError
from tesla_gateway.models.plausibility import PlausibleRange
from tesla_gateway.models.runtime import (
    DEFAULT_RUNTIME_PREFERENCE,
    BatchedInterpreter,
    RuntimeName,
    select_runtime,
)
from tesla_gateway.models.trust import ModelTrust

__all__ = ["CalibrationError", "Calibrator"]

Float32Array = npt.NDArray[np.float32]


class CalibrationError(GatewayError):
    """A model in service failed to run a batch; the tick publishes raw values instead."""


class Calibrator:
    """One loaded model (one feature): ``calibrate([B, N]) -> [B]`` in a single invoke."""

    def __init__(
        self,
        *,
        model_dir: Path,
        manifest: Manifest,
        interpreter: BatchedInterpreter,
        runtime_name: RuntimeName,
        runtime_version: str,
        sha256: str,
        trust: str = "sha256",
    ) -> None:
        self.model_dir = model_dir
        self.manifest = manifest
        self.runtime_name = runtime_name
        self.runtime_version = runtime_version
        self.sha256 = sha256
        self.trust = trust  # how the directory was vouched for (tesla_gateway/models/trust.py)
        self.geometry = WindowGeometry.from_manifest(manifest)
        self.plausible = PlausibleRange.of(manifest)  # what its outputs may be published as
        self._interpreter = interpreter

    @property
    def feature(self) -> str:
        return self.manifest.feature

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one window: ``(N,)`` for one channel, ``(N, C)`` for several."""
        n = self.manifest.window_length
        channels = len(self.manifest.input_channels)
        return (n,) if channels == 1 else (n, channels)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        runtime_preference: Sequence[RuntimeName] = DEFAULT_RUNTIME_PREFERENCE,
        *,
        num_threads: int | None = None,
        trust: ModelTrust | None = None,
    ) -> Calibrator:
        """Validate and load a model directory; raise ManifestError/ModelIntegrityError/
        ModelLoadError naming what is wrong; ``trust`` is the signature rule of
        tesla_gateway/models/trust.py (default: sha256, plus the signature when a key is given)."""
        manifest = load_manifest(model_dir)
        entry = manifest.files.get("float32")
        if entry is None:
            raise ModelLoadError(
                f"{model_dir}: the manifest lists no float32 model; the gateway runs the float32 "
                "graph with a dynamic batch"
            )
        if entry.batch != "dynamic":
            raise ModelLoadError(
                f"{model_dir / entry.path}: batch is {entry.batch}, the gateway needs 'dynamic'"
            )
        verify_model_files(model_dir, manifest)
        vouched = (trust or ModelTrust()).check(model_dir, manifest)
        try:
            content = (model_dir / entry.path).read_bytes()
        except OSError as exc:
            raise ModelIntegrityError(f"cannot read {model_dir / entry.path}: {exc}") from exc
        digest = hashlib.sha256(content).hexdigest()
        if digest != entry.sha256:  # replaced between the check and the read
            raise ModelIntegrityError(
                f"{model_dir / entry.path} changed while loading; copy the model directory again"
            )
        runtime = select_runtime(runtime_preference)
        try:
            interpreter = BatchedInterpreter(runtime.interpreter(content, num_threads))
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(
                f"{runtime.name} cannot load {model_dir / entry.path}: {exc}"
            ) from exc
        calibrator = cls(
            model_dir=model_dir,
            manifest=manifest,
            interpreter=interpreter,
            runtime_name=runtime.name,
            runtime_version=runtime.version,
            sha256=digest,
            trust=vouched,
        )
        calibrator._check_signature(interpreter)
        calibrator._test_invoke()
        return calibrator

    def _check_signature(self, interpreter: BatchedInterpreter) -> None:
        expected = (-1, *self.input_shape)
        if interpreter.input_signature != expected:
            raise ModelLoadError(
                f"{self.model_dir}: input shape {list(interpreter.input_signature)} does not match "
                f"the manifest's [batch, ...] = {list(expected)} (-1 = dynamic batch)"
            )
        if interpreter.output_signature != (-1, 1):
            raise ModelLoadError(
                f"{self.model_dir}: output shape {list(interpreter.output_signature)}, "
                "expected [-1, 1] (one calibrated value per window)"
            )
        if interpreter.input_dtype != np.float32:
            raise ModelLoadError(
                f"{self.model_dir}: input is {interpreter.input_dtype}, not float32"
            )

    def _test_invoke(self) -> None:
        median = self.manifest.input_range.p50
        window = np.full((1, *self.input_shape), median, dtype=np.float32)
        neutral_hours(window, self.manifest.channel_names)
        try:
            value = float(self.calibrate(window)[0])
        except CalibrationError as exc:
            raise ModelLoadError(f"{self.model_dir}: test invoke failed: {exc}") from exc
        if not math.isfinite(value):
            raise ModelLoadError(
                f"{self.model_dir}: test invoke on a constant window of {median} µg/m³ returned "
                f"{value}; the model is broken, refusing it"
            )

    def calibrate(self, windows: Float32Array) -> Float32Array:
        """Calibrated values ``[B]`` for windows ``[B, N]`` (or ``[B, N, C]``), one invoke."""
        batch = np.ascontiguousarray(windows, dtype=np.float32)
        if batch.shape[1:] != self.input_shape:
            raise CalibrationError(
                f"windows of shape {batch.shape[1:]} given to {self.name} v{self.version}, "
                f"which takes {self.input_shape}"
            )
        if batch.shape[0] == 0:
            return np.empty(0, dtype=np.float32)
        try:
            return self._interpreter.run(batch)
        except (ValueError, RuntimeError) as exc:
            raise CalibrationError(f"{self.name} v{self.version} invoke failed: {exc}") from exc
