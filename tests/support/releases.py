"""Signed releases of the committed default model, at any version, for the OTA tests.

The default model directory is copied and its manifest rewritten with another version (the
FlatBuffers are unchanged, so their sha256 still match); then the real ``build_release`` signs it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from tesla_gateway.contract.manifest import (
    MANIFEST_FILENAME,
    Manifest,
    load_manifest,
    write_manifest,
)
from tesla_gateway.ota.release import RELEASE_FILENAME, signed_bytes
from training.release import KeyPair, build_release, keygen, load_private_key

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

    def model_at(
        self,
        version: int,
        *,
        image: Path | None = None,
        manifest_update: Mapping[str, object] | None = None,
    ) -> Path:
        """A copy of the model directory announcing ``version`` (optionally another int8 file,
        other manifest fields such as ``min_history_periods``)."""
        target = self.root / f"model-v{version}-{image.stem if image else 'same'}"
        target = target.with_name(target.name + _suffix(manifest_update))
        if target.exists():
            return target
        shutil.copytree(self.source, target)
        manifest = load_manifest(target)
        files = dict(manifest.files)
        if image is not None:
            from tesla_gateway.contract.manifest import sha256_file

            shutil.copyfile(image, target / files["int8"].path)
            path = target / files["int8"].path
            files["int8"] = files["int8"].model_copy(
                update={"sha256": sha256_file(path), "size_bytes": path.stat().st_size}
            )
        update = {**(manifest_update or {}), "version": version, "files": files}
        write_manifest(target, Manifest.model_validate({**manifest.model_dump(), **update}))
        return target

    def release(
        self,
        version: int,
        target: str = "node",
        *,
        key: Path | None = None,
        image: Path | None = None,
        manifest_update: Mapping[str, object] | None = None,
    ) -> Path:
        out = self.root / f"release-{target}-v{version}-{key.parent.name if key else 'main'}"
        if image is not None:
            out = out.with_name(out.name + "-" + image.stem)
        out = out.with_name(out.name + _suffix(manifest_update))
        if not out.exists():
            build_release(
                self.model_at(version, image=image, manifest_update=manifest_update),
                target,  # type: ignore[arg-type]
                key if key is not None else self.keys.private_path,
                out,
            )
        return out

    def resigned(self, base: Path, name: str, replace: Mapping[str, bytes | None]) -> Path:
        """A copy of release ``base`` with files replaced (None: removed), signed again with
        the kit's key: what a release tool without today's checks could have published."""
        out = self.root / name
        shutil.copytree(base, out)
        document = json.loads((out / RELEASE_FILENAME).read_text(encoding="utf-8"))
        for file_name, data in replace.items():
            if data is None:
                (out / file_name).unlink()
                del document["files"][file_name]
                continue
            (out / file_name).write_bytes(data)
            document["files"][file_name] = {
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        signing = load_private_key(self.keys.private_path)
        signature = signing.sign(signed_bytes(document)).signature
        document["signature"] = base64.b64encode(signature).decode("ascii")
        (out / RELEASE_FILENAME).write_text(json.dumps(document, indent=2), encoding="utf-8")
        return out

    def mismatched(self, version: int, other_model: Path) -> Path:
        """A signed gateway release whose float graph is ``other_model``'s (e.g. N = 168)
        under this model's manifest (N = 360): hashes and signature valid, the graph unfit."""
        name = f"release-gateway-v{version}-graph-of-{other_model.name}"
        if (self.root / name).exists():
            return self.root / name
        base = self.release(version, "gateway")
        manifest = Manifest.model_validate_json((base / MANIFEST_FILENAME).read_bytes())
        graph = (other_model / "model.tflite").read_bytes()
        files = dict(manifest.files)
        files["float32"] = files["float32"].model_copy(
            update={"sha256": hashlib.sha256(graph).hexdigest(), "size_bytes": len(graph)}
        )
        text = manifest.model_copy(update={"files": files}).model_dump_json(indent=2) + "\n"
        return self.resigned(
            base,
            name,
            {files["float32"].path: graph, MANIFEST_FILENAME: text.encode("utf-8")},
        )


def _suffix(manifest_update: Mapping[str, object] | None) -> str:
    """A directory-name suffix that tells releases with other manifest fields apart."""
    return "".join(f"-{key}={value}" for key, value in sorted((manifest_update or {}).items()))
