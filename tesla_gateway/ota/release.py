"""Signed model releases: the format, and the verification every gateway runs before installing.

A release is a directory (or, on MQTT, one JSON bundle of the same content) holding the model's
FlatBuffer(s) for one target, its ``manifest.json`` and ``release.json``::

    {"format_version": 1, "model": "pm10-ispra-1min", "version": 7, "feature": "pm10",
     "target": "gateway" | "node",
     "files": {"manifest.json": {"sha256": "...", "size": 4242}, "model.tflite": {...}},
     "node_image": {"file": "model_int8.tflite", "descriptor": "<base64>",
                    "signature": "<base64>"},            # node releases only
     "rollout": {"gateways": ["pi-kitchen"], "groups": ["canary"]},   # optional
     "key_id": "<first 16 hex of sha256(public key)>",
     "signature": "<base64 Ed25519 over the canonical JSON of everything else>"}

Canonical JSON is ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` of the
document without ``signature``; every value is a string, an integer or a list of strings, so it is
unambiguous. A ``rollout`` names the gateways (ids or ``[ota] groups``) the release is for; the
others ignore it. Gateway releases may carry ``golden.json`` (tesla_gateway/ota/golden.py). The
node image descriptor (tesla_gateway/ota/descriptor.py) is signed separately with the same key
because
the firmware checks it without a JSON parser. training/release.py writes releases; this module is
the contract and never needs the private key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from nacl.exceptions import BadSignatureError as NaclBadSignatureError
from nacl.signing import VerifyKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tesla_gateway.contract.manifest import MANIFEST_FILENAME, Manifest
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.errors import (
    BadSignatureError,
    DowngradeError,
    MalformedReleaseError,
    OtaError,
    ShaMismatchError,
    SizeMismatchError,
    UnknownKeyError,
    WrongTargetError,
)

__all__ = [
    "RELEASE_FILENAME",
    "RELEASE_FORMAT_VERSION",
    "ROLLOUT_NAME",
    "NodeImage",
    "ReleaseFile",
    "ReleaseMetadata",
    "Rollout",
    "Target",
    "VerifiedRelease",
    "canonical_json",
    "decode_bundle",
    "encode_bundle",
    "key_id",
    "load_public_key",
    "read_release_dir",
    "signed_bytes",
    "verify_release",
]

RELEASE_FILENAME = "release.json"
RELEASE_FORMAT_VERSION: Literal[1] = 1
Target = Literal["gateway", "node"]
_MAX_RELEASE_BYTES = 16 * 1024 * 1024  # a model is tens of kB; refuse absurd bundles early
ROLLOUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a gateway id or group name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReleaseFile(_Strict):
    """One file of the release, as signed."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the file.")
    size: int = Field(ge=1, lt=_MAX_RELEASE_BYTES, description="Size in bytes.")


class NodeImage(_Strict):
    """For node releases: which file is flashed, and its signed binary descriptor."""

    file: str = Field(description="The FlatBuffer sent to the node.")
    descriptor: str = Field(description="Base64 of the 88-byte image descriptor.")
    signature: str = Field(description="Base64 Ed25519 signature of the descriptor bytes.")


class Rollout(_Strict):
    """Which gateways a release is for (signed): by id, or by a group in their ``[ota]``."""

    gateways: list[str] = Field(default_factory=list, max_length=1000)
    groups: list[str] = Field(default_factory=list, max_length=100)

    @field_validator("gateways", "groups")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not ROLLOUT_NAME.fullmatch(name):
                raise ValueError(f"{name!r} must match {ROLLOUT_NAME.pattern}")
        return sorted(set(value))

    def includes(self, gateway_id: str, groups: Sequence[str]) -> bool:
        return gateway_id in self.gateways or bool(set(groups) & set(self.groups))

    def describe(self) -> str:
        parts = [f"gateways {self.gateways}"] if self.gateways else []
        parts += [f"groups {self.groups}"] if self.groups else []
        return " and ".join(parts) or "no gateway"


class ReleaseMetadata(_Strict):
    """The content of release.json."""

    format_version: Literal[1] = RELEASE_FORMAT_VERSION
    model: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="Model name.")
    version: int = Field(ge=1, lt=2**32, description="The manifest's release number.")
    feature: str = Field(description="Feature the model calibrates.")
    target: Target
    files: dict[str, ReleaseFile] = Field(min_length=2)
    node_image: NodeImage | None = None
    rollout: Rollout | None = Field(
        default=None, description="The gateways it is for; absent: every gateway."
    )
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="Which key signed it.")
    signature: str = Field(description="Base64 Ed25519 over the canonical JSON of the rest.")

    @field_validator("files")
    @classmethod
    def _plain_names(cls, value: dict[str, ReleaseFile]) -> dict[str, ReleaseFile]:
        for name in value:
            if Path(name).name != name or name in {"", ".", "..", RELEASE_FILENAME}:
                raise ValueError(f"{name!r} must be a plain file name")
        if MANIFEST_FILENAME not in value:
            raise ValueError(f"a release must contain {MANIFEST_FILENAME}")
        return value


@dataclass(frozen=True)
class VerifiedRelease:
    """A release whose signature, hashes, sizes, target and version were all checked."""

    metadata: ReleaseMetadata
    manifest: Manifest
    files: Mapping[str, bytes] = field(repr=False)
    # release.json exactly as signed: installed beside the model so the load can re-verify it
    release_json: bytes = field(default=b"", repr=False)

    @property
    def target(self) -> Target:
        return self.metadata.target

    @property
    def version(self) -> int:
        return self.metadata.version

    def is_for(self, gateway_id: str, groups: Sequence[str]) -> bool:
        """Whether this gateway is in the release's signed rollout (every gateway if none)."""
        rollout = self.metadata.rollout
        return rollout is None or rollout.includes(gateway_id, groups)

    @property
    def node_image(self) -> bytes:
        """The FlatBuffer a node flashes (node releases only)."""
        image = self._node_image()
        return self.files[image.file]

    @property
    def descriptor(self) -> bytes:
        return base64.b64decode(self._node_image().descriptor)

    @property
    def descriptor_signature(self) -> bytes:
        return base64.b64decode(self._node_image().signature)

    def _node_image(self) -> NodeImage:
        if self.metadata.node_image is None:
            raise WrongTargetError(f"release {self.metadata.model} is not a node release")
        return self.metadata.node_image


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The byte form that is signed: sorted keys, no whitespace, ASCII only."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode(
        "ascii"
    )


def signed_bytes(document: Mapping[str, Any]) -> bytes:
    """Canonical JSON of a release document without its ``signature``."""
    return canonical_json({k: v for k, v in document.items() if k != "signature"})


def key_id(public_key: bytes) -> str:
    """Short fingerprint naming a key in release.json (not a secret, not a check by itself)."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def load_public_key(path: Path) -> bytes:
    """Read a public key file written by ``tesla-train keygen`` (64 hex digits)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OtaError(f"cannot read the release public key {path}: {exc}") from exc
    try:
        key = bytes.fromhex(text)
    except ValueError as exc:
        raise OtaError(f"{path} is not a hex public key; use the .pub file from keygen") from exc
    if len(key) != 32:
        raise OtaError(f"{path} holds {len(key)} bytes; an Ed25519 public key has 32")
    return key


def encode_bundle(release_json: bytes, files: Mapping[str, bytes]) -> bytes:
    """One MQTT payload carrying a whole release: release.json and each file in base64."""
    document = {
        "release": json.loads(release_json),
        "files": {name: base64.b64encode(data).decode("ascii") for name, data in files.items()},
    }
    return json.dumps(document, sort_keys=True).encode("utf-8")


def decode_bundle(payload: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Inverse of :func:`encode_bundle`; every problem is a :class:`MalformedReleaseError`."""
    if len(payload) > 2 * _MAX_RELEASE_BYTES:
        raise MalformedReleaseError(f"release bundle of {len(payload)} bytes is too large")
    try:
        document = json.loads(payload)
        release = document["release"]
        encoded = document["files"]
        if not isinstance(release, dict) or not isinstance(encoded, dict):
            raise TypeError("release and files must be objects")
        files = {str(n): base64.b64decode(str(d), validate=True) for n, d in encoded.items()}
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise MalformedReleaseError(f"not a release bundle ({exc}); publish with `push`") from exc
    return release, files


def read_release_dir(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """release.json and the files it lists, read from a release directory."""
    try:
        release = json.loads((path / RELEASE_FILENAME).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise MalformedReleaseError(f"{path} has no {RELEASE_FILENAME}: not a release") from exc
    except (OSError, ValueError) as exc:
        raise MalformedReleaseError(f"cannot read {path / RELEASE_FILENAME}: {exc}") from exc
    if not isinstance(release, dict):
        raise MalformedReleaseError(f"{path / RELEASE_FILENAME} is not a JSON object")
    files: dict[str, bytes] = {}
    listed = release.get("files")
    for name in listed if isinstance(listed, dict) else {}:
        candidate = path / str(name)
        if Path(str(name)).name != name or not candidate.is_file():
            raise MalformedReleaseError(f"release file {name!r} is missing from {path}")
        files[str(name)] = candidate.read_bytes()
    return release, files


def _verify_signature(public_key: bytes, message: bytes, signature_b64: str, what: str) -> None:
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise MalformedReleaseError(f"{what} signature is not base64") from exc
    if len(signature) != 64:
        raise BadSignatureError(f"{what} signature has {len(signature)} bytes, not 64")
    try:
        VerifyKey(public_key).verify(message, signature)
    except NaclBadSignatureError as exc:
        raise BadSignatureError(
            f"{what} signature does not verify: the release was altered after signing or signed "
            "with a different key; re-create it with `tesla-train release` and the right key"
        ) from exc


def _parse_metadata(document: Mapping[str, Any]) -> ReleaseMetadata:
    try:
        return ReleaseMetadata.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise MalformedReleaseError(f"release.json is not a valid release: {problems}") from exc


def _check_files(metadata: ReleaseMetadata, files: Mapping[str, bytes]) -> None:
    extra = sorted(set(files) - set(metadata.files))
    if extra:
        raise MalformedReleaseError(f"files {extra} are not covered by the signature")
    for name, entry in metadata.files.items():
        data = files.get(name)
        if data is None:
            raise MalformedReleaseError(f"release file {name} is missing")
        if len(data) != entry.size:
            raise SizeMismatchError(
                f"{name} has {len(data)} bytes, the signed metadata says {entry.size}: the file "
                "was truncated or replaced in transit; publish the release again"
            )
        actual = hashlib.sha256(data).hexdigest()
        if actual != entry.sha256:
            raise ShaMismatchError(
                f"{name} sha256 {actual[:12]}… differs from the signed {entry.sha256[:12]}…: "
                "the file is corrupt or was replaced; publish the release again"
            )


def _check_manifest(metadata: ReleaseMetadata, files: Mapping[str, bytes]) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(files[MANIFEST_FILENAME])
    except ValidationError as exc:
        raise MalformedReleaseError(f"the release's manifest.json is invalid: {exc}") from exc
    if (manifest.name, manifest.version, manifest.feature) != (
        metadata.model,
        metadata.version,
        metadata.feature,
    ):
        raise MalformedReleaseError(
            f"release says {metadata.model} v{metadata.version} ({metadata.feature}) but its "
            f"manifest says {manifest.name} v{manifest.version} ({manifest.feature})"
        )
    wanted = {entry.path for entry in manifest.files.values()}
    if metadata.target == "gateway" and not wanted <= set(files):
        raise MalformedReleaseError(
            f"a gateway release needs every file its manifest lists; missing "
            f"{sorted(wanted - set(files))}"
        )
    return manifest


def _check_node_image(
    metadata: ReleaseMetadata, files: Mapping[str, bytes], manifest: Manifest, public_key: bytes
) -> None:
    image = metadata.node_image
    if metadata.target == "gateway":
        if image is not None:
            raise MalformedReleaseError("a gateway release must not carry a node image")
        return
    if image is None:
        raise MalformedReleaseError("a node release must carry node_image")
    if image.file not in files:
        raise MalformedReleaseError(f"node image {image.file} is not in the release")
    try:
        raw = base64.b64decode(image.descriptor, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise MalformedReleaseError("node image descriptor is not base64") from exc
    _verify_signature(public_key, raw, image.signature, "node image descriptor")
    descriptor = ImageDescriptor.decode(raw)
    data = files[image.file]
    expected = ImageDescriptor.of_image(manifest, data, arena_bytes=descriptor.arena_bytes)
    if descriptor.min_history_periods is None:
        # Format 1, from a release tool before min_history: the node calibrates whole windows.
        expected = replace(expected, min_history_periods=None)
    if descriptor != expected:
        raise MalformedReleaseError(
            f"node image descriptor {descriptor} does not describe {image.file} of this release"
        )


def verify_release(
    source: Path | bytes,
    public_key: bytes,
    running_version: int | None,
    allow_downgrade: bool = False,
    *,
    target: Target | None = None,
) -> VerifiedRelease:
    """Check a release directory or MQTT bundle; raise a :class:`ReleaseRejectedError` subclass.

    Authenticity is checked before anything the release claims is believed, so a forged release
    is reported as a signature problem, never as a downgrade.
    """
    document, files = (
        read_release_dir(source) if isinstance(source, Path) else decode_bundle(source)
    )
    if document.get("format_version") != RELEASE_FORMAT_VERSION:
        raise MalformedReleaseError(
            f"release format {document.get('format_version')!r} is not "
            f"{RELEASE_FORMAT_VERSION}; update this gateway or re-create the release"
        )
    metadata = _parse_metadata(document)
    if metadata.key_id != key_id(public_key):
        raise UnknownKeyError(
            f"release {metadata.model} v{metadata.version} is signed by key {metadata.key_id}, "
            f"this device trusts key {key_id(public_key)}; sign it with the configured key or "
            "configure its public key"
        )
    _verify_signature(public_key, signed_bytes(document), metadata.signature, "release")
    if target is not None and metadata.target != target:
        raise WrongTargetError(
            f"release {metadata.model} v{metadata.version} is for a {metadata.target}, not a "
            f"{target}; create it with `release --target {target}`"
        )
    _check_files(metadata, files)
    manifest = _check_manifest(metadata, files)
    _check_node_image(metadata, files, manifest, public_key)
    if running_version is not None and metadata.version <= running_version and not allow_downgrade:
        raise DowngradeError(
            f"release {metadata.model} v{metadata.version} is not newer than the running "
            f"v{running_version}; publish a higher version or allow the downgrade explicitly"
        )
    return VerifiedRelease(
        metadata=metadata,
        manifest=manifest,
        files=MappingProxyType(files),
        release_json=canonical_json(document),
    )
