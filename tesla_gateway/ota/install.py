"""Install a verified gateway release into a model slot: stage, check, switch, or leave untouched.

1. **Stage**: every file of the release (and its signed ``release.json``) is written and fsynced
   into a new slot beside the serving model (tesla_gateway/models/slots.py); nothing points to it.
2. **Check**: the real Calibrator loads the slot (sha256, the trust rule, the graph's shape
   against the manifest, a test invoke), runs the release's golden windows and holds their
   outputs to the run-time plausibility bound (tesla_gateway/ota/golden.py).
3. **Switch**: one rename makes the slot ``current``; the serving slot becomes ``previous``.

A release that fails step 2 is refused (``rejected: unloadable`` / ``golden mismatch`` /
``implausible``) and its slot removed; the model directory is as it was. A process killed at any
step leaves the old model or the new one current, never a mix: the next start serves one of
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tesla_gateway.errors import GatewayError
from tesla_gateway.models.calibrator import Calibrator
from tesla_gateway.models.slots import ModelSlots
from tesla_gateway.ota.errors import (
    IncompatibleReleaseError,
    ReleaseInstallError,
    UnloadableReleaseError,
    WrongTargetError,
)
from tesla_gateway.ota.golden import GOLDEN_FILENAME, check_golden, check_plausible, parse_golden
from tesla_gateway.ota.release import RELEASE_FILENAME, VerifiedRelease

__all__ = ["InstalledRelease", "install_release"]

LoadModel = Callable[[Path], Calibrator]


@dataclass(frozen=True)
class InstalledRelease:
    """A release now current in ``slot``, and the Calibrator that checked it (ready to serve)."""

    slot: Path
    calibrator: Calibrator
    golden_deviation: float | None  # largest |output - expected| over the golden windows


def install_release(
    release: VerifiedRelease,
    model_dir: Path,
    feature: str,
    *,
    load: LoadModel | None = None,
    keep: Path | None = None,
) -> InstalledRelease:
    """Stage ``release`` in ``model_dir`` (serving ``feature``), check it, make it current.

    ``load`` is how the gateway loads a model (its runtime and trust rule; default: the
    Calibrator's defaults); ``keep`` is the serving model's directory, kept as ``previous``.
    """
    if release.target != "gateway":
        raise WrongTargetError(f"{release.metadata.model} is a node release; gateways relay it")
    if release.manifest.feature != feature:
        raise IncompatibleReleaseError(
            f"release {release.metadata.model} calibrates {release.manifest.feature}, "
            f"{model_dir} serves {feature}"
        )
    golden = release.files.get(GOLDEN_FILENAME)
    parsed = None if golden is None else parse_golden(golden)
    slots = ModelSlots(model_dir)
    what = f"{release.metadata.model} v{release.version}"
    try:
        # The signed release.json stays beside the model: a directory the daemon can write is
        # trusted only through it (tesla_gateway/models/trust.py).
        slot = slots.stage(
            release.version, {**release.files, RELEASE_FILENAME: release.release_json}
        )
    except OSError as exc:
        raise ReleaseInstallError(
            f"cannot stage {what} in {model_dir}: {exc.strerror or exc}; check free space and "
            "that the daemon may write there"
        ) from exc
    try:
        try:
            calibrator = (load or Calibrator.load)(slot)
        except GatewayError as exc:
            raise UnloadableReleaseError(f"{what} does not load: {exc}") from exc
        deviation = None if parsed is None else check_golden(calibrator, parsed)
        check_plausible(calibrator, parsed)
        slots.commit(slot, keep=keep)
    except OSError as exc:
        slots.discard(slot)
        raise ReleaseInstallError(
            f"cannot switch {model_dir} to {what}: {exc.strerror or exc}"
        ) from exc
    except BaseException:
        slots.discard(slot)
        raise
    slots.prune()
    return InstalledRelease(slot=slot, calibrator=calibrator, golden_deviation=deviation)
