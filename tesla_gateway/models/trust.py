"""Whether a model directory may be believed: the trust rule applied before a model is loaded.

The sha256 sums in a manifest only prove that the files match the manifest; whoever can write
the directory can rewrite both. So a directory the daemon itself can write (an OTA install
target, a copy an operator dropped in) must also carry the ``release.json`` of a signed gateway
release whose signature verifies with the configured release key and whose signed hashes cover
the manifest and every FlatBuffer in it. A directory the daemon cannot write (the root-owned
default models under ``ProtectSystem=strict``) is as trustworthy as the files the daemon runs.

Policies (``[[models]] signature``): ``auto`` (the default) applies the rule above when a
release key is configured; ``required`` demands a valid signature whatever the permissions;
``off`` checks sha256 only (development).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tesla_gateway.contract.manifest import MANIFEST_FILENAME, Manifest
from tesla_gateway.errors import ModelIntegrityError
from tesla_gateway.ota.errors import OtaError
from tesla_gateway.ota.release import RELEASE_FILENAME, key_id, verify_release

__all__ = ["ModelTrust", "SignaturePolicy", "UntrustedModelError", "writable_by_daemon"]

SignaturePolicy = Literal["auto", "required", "off"]


class UntrustedModelError(ModelIntegrityError):
    """The directory's content is not vouched for by a signature the rule demands."""


def writable_by_daemon(model_dir: Path) -> bool:
    """True if this process may change the directory or any file in it."""
    if os.access(model_dir, os.W_OK):
        return True
    try:
        return any(os.access(path, os.W_OK) for path in model_dir.iterdir() if path.is_file())
    except OSError:
        return False


@dataclass(frozen=True)
class ModelTrust:
    """The trust rule for one model slot: its policy and the release key (if configured)."""

    policy: SignaturePolicy = "auto"
    public_key: bytes | None = None

    def check(self, model_dir: Path, manifest: Manifest) -> str:
        """Raise :class:`UntrustedModelError`, or return how the directory was vouched for."""
        if self.policy == "off":
            return "sha256 only (signature: off)"
        writable = writable_by_daemon(model_dir)
        if self.policy == "auto" and not writable:
            return "sha256; read-only for the daemon"
        if self.public_key is None:
            if self.policy == "required":
                raise UntrustedModelError(
                    f"{model_dir}: signature = 'required' but no release key is configured; "
                    "set [ota] public_key_file"
                )
            return "sha256 only: writable by the daemon and no release key configured"
        return self._verify(model_dir, manifest, writable)

    def _verify(self, model_dir: Path, manifest: Manifest, writable: bool) -> str:
        assert self.public_key is not None
        why = "the daemon can write it" if writable else "signature = 'required'"
        if not (model_dir / RELEASE_FILENAME).is_file():
            raise UntrustedModelError(
                f"{model_dir} has no {RELEASE_FILENAME} and {why}: install models there only as "
                "signed releases (`tesla-train release --target gateway`, then `push`), or make "
                "the directory read-only for the daemon"
            )
        try:
            release = verify_release(model_dir, self.public_key, None, target="gateway")
        except OtaError as exc:
            raise UntrustedModelError(f"{model_dir}: {exc}") from exc
        needed = {entry.path for entry in manifest.files.values()} | {MANIFEST_FILENAME}
        missing = sorted(name for name in needed if name not in release.metadata.files)
        if missing or release.manifest != manifest:
            raise UntrustedModelError(
                f"{model_dir}: {RELEASE_FILENAME} does not cover {missing or 'this manifest'}; "
                "the directory was changed after the release was installed"
            )
        return f"signed release v{release.version} (key {key_id(self.public_key)})"
