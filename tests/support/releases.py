"""Signed releases of the committed default model, at any version, for the OTA tests.

The default model directory is copied and its manifest rewritten with another version (the
FlatBuffers are unchanged, so their sha256 still match); then the real ``build_release`` signs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gateway.manifest import load_manifest, write_manifest
from training.release import KeyPair, build_release, keygen

__all__ = ["DEFAULT_NODE_MODEL", "ReleaseKit"]

DEFAULT_NODE_MODEL = Path(__file__).resolve().parents[2] / "models" / "pm10-ispra-1min"


class ReleaseKit:
    """A key pair and a scratch directory; builds releases on demand."""

    def __init__(self, root: Path, model_dir: Path = DEFAULT_NODE_MODEL) -> None:
        self.root = root
        self.source = model_dir
        self.keys: KeyPair = keygen(root / "keys")
        self.base_version = load_manifest(model_dir).version

    @property
    def public_key(self) -> bytes:
        return bytes.fromhex(self.keys.public_path.read_text(encoding="ascii"))

    def model_at(self, version: int, *, image: Path | None = None) -> Path:
        """A copy of the model directory announcing ``version`` (optionally another int8 file)."""
        target = self.root / f"model-v{version}-{image.stem if image else 'same'}"
        if target.exists():
            return target
        shutil.copytree(self.source, target)
        manifest = load_manifest(target)
        files = dict(manifest.files)
        if image is not None:
            from gateway.manifest import sha256_file

            shutil.copyfile(image, target / files["int8"].path)
            path = target / files["int8"].path
            files["int8"] = files["int8"].model_copy(
                update={"sha256": sha256_file(path), "size_bytes": path.stat().st_size}
            )
        write_manifest(target, manifest.model_copy(update={"version": version, "files": files}))
        return target

    def release(
        self,
        version: int,
        target: str = "node",
        *,
        key: Path | None = None,
        image: Path | None = None,
    ) -> Path:
        out = self.root / f"release-{target}-v{version}-{key.parent.name if key else 'main'}"
        if image is not None:
            out = out.with_name(out.name + "-" + image.stem)
        if not out.exists():
            build_release(
                self.model_at(version, image=image),
                target,  # type: ignore[arg-type]
                key if key is not None else self.keys.private_path,
                out,
            )
        return out
