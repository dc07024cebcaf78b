"""Install a verified gateway release into a model directory so the hot reload picks it up.

Every file is written to a temporary name in the same directory, fsynced, then renamed over the
old one: FlatBuffers first, then ``release.json``, ``manifest.json`` last. A reader (the model
watcher) therefore sees
either the old model or, once the manifest lands, the new one; in between the new FlatBuffer
with the old manifest fails its sha256 check and the serving model stays in service until the
manifest arrives and the directory's fingerprint changes again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gateway.manifest import MANIFEST_FILENAME
from gateway.ota.errors import IncompatibleReleaseError, ReleaseInstallError, WrongTargetError
from gateway.ota.release import RELEASE_FILENAME, VerifiedRelease

__all__ = ["install_release"]


def _write_atomic(directory: Path, name: str, data: bytes) -> None:
    handle, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        Path(temp_name).chmod(0o644)
        Path(temp_name).replace(directory / name)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def install_release(release: VerifiedRelease, model_dir: Path, feature: str) -> None:
    """Write ``release`` into ``model_dir``, which serves ``feature``."""
    if release.target != "gateway":
        raise WrongTargetError(f"{release.metadata.model} is a node release; gateways relay it")
    if release.manifest.feature != feature:
        raise IncompatibleReleaseError(
            f"release {release.metadata.model} calibrates {release.manifest.feature}, "
            f"{model_dir} serves {feature}"
        )
    order = sorted(name for name in release.files if name != MANIFEST_FILENAME)
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        for name in order:
            _write_atomic(model_dir, name, release.files[name])
        # The signed release.json stays beside the model: a directory the daemon can write is
        # trusted only through it (gateway/model_trust.py).
        _write_atomic(model_dir, RELEASE_FILENAME, release.release_json)
        _write_atomic(model_dir, MANIFEST_FILENAME, release.files[MANIFEST_FILENAME])
        directory = os.open(model_dir, os.O_RDONLY)
        try:
            os.fsync(directory)  # the renames themselves survive a power cut
        finally:
            os.close(directory)
    except OSError as exc:
        raise ReleaseInstallError(
            f"cannot install {release.metadata.model} v{release.version} into {model_dir}: "
            f"{exc.strerror or exc}; check free space and that the daemon may write there"
        ) from exc
