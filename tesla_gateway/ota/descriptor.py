"""The node image descriptor: the 88 signed bytes a node checks before and after a transfer.

A microcontroller cannot cheaply parse and canonicalise JSON, so a node release carries a small
fixed-layout binary statement signed (Ed25519) with the same release key: which model, which
version, how many bytes, their sha256, and the window length and arena the model needs. The node
checks the signature at the handshake (refusing a wrong key, a downgrade or a model that does not
fit before a byte is transferred) and the sha256 after the last chunk. Layout (little endian),
mirrored in firmware/src/ota_descriptor.h::

    offset size field
    0      4    magic "TMDL"
    4      1    descriptor format (1)
    5      1    target (1 = node)
    6      2    flags (0; reserved)
    8      4    model version (uint32)
    12     4    image size in bytes (uint32)
    16     32   sha256 of the image
    48     32   model name, ASCII, NUL padded
    80     4    window length N (uint32)
    84     4    TFLite Micro arena bytes the model needs (uint32)
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from tesla_gateway.contract.manifest import Manifest
from tesla_gateway.ota.errors import MalformedReleaseError

__all__ = [
    "DESCRIPTOR_FORMAT",
    "DESCRIPTOR_MAGIC",
    "DESCRIPTOR_SIZE",
    "TARGET_NODE",
    "ImageDescriptor",
]

DESCRIPTOR_MAGIC = b"TMDL"
DESCRIPTOR_FORMAT = 1
TARGET_NODE = 1
_LAYOUT = struct.Struct("<4sBBHII32s32sII")
DESCRIPTOR_SIZE = _LAYOUT.size  # 88
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")  # the line protocol's version text


@dataclass(frozen=True, slots=True)
class ImageDescriptor:
    """What a node image is; ``encode`` gives the exact bytes that are signed."""

    model_name: str
    model_version: int
    image_size: int
    image_sha256: bytes
    window_length: int
    arena_bytes: int

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.model_name):
            raise MalformedReleaseError(
                f"model name {self.model_name!r} cannot be sent to a node: it must match "
                f"{_NAME.pattern} (at most 32 characters)"
            )
        if len(self.image_sha256) != 32:
            raise MalformedReleaseError("image sha256 must be 32 bytes")
        for label, value in (
            ("model version", self.model_version),
            ("image size", self.image_size),
            ("window length", self.window_length),
            ("arena bytes", self.arena_bytes),
        ):
            if not 0 <= value < 2**32:
                raise MalformedReleaseError(f"{label} {value} does not fit in a uint32")

    @classmethod
    def of_image(cls, manifest: Manifest, image: bytes, *, arena_bytes: int) -> ImageDescriptor:
        """The descriptor of ``image``, the device graph of the model ``manifest`` describes.

        The one place that says which manifest fields a node is told: the release tool, the
        firmware's factory image and the gateway's release check all build it here.
        """
        return cls(
            model_name=manifest.name,
            model_version=manifest.version,
            image_size=len(image),
            image_sha256=hashlib.sha256(image).digest(),
            window_length=manifest.window_length,
            arena_bytes=arena_bytes,
        )

    def encode(self) -> bytes:
        return _LAYOUT.pack(
            DESCRIPTOR_MAGIC,
            DESCRIPTOR_FORMAT,
            TARGET_NODE,
            0,
            self.model_version,
            self.image_size,
            self.image_sha256,
            self.model_name.encode("ascii"),
            self.window_length,
            self.arena_bytes,
        )

    @classmethod
    def decode(cls, data: bytes) -> ImageDescriptor:
        if len(data) != DESCRIPTOR_SIZE:
            raise MalformedReleaseError(
                f"descriptor has {len(data)} bytes, expected {DESCRIPTOR_SIZE}"
            )
        magic, fmt, target, flags, version, size, sha, name, window, arena = _LAYOUT.unpack(data)
        if magic != DESCRIPTOR_MAGIC or fmt != DESCRIPTOR_FORMAT:
            raise MalformedReleaseError(
                f"descriptor magic/format {magic!r}/{fmt} is not {DESCRIPTOR_MAGIC!r}/"
                f"{DESCRIPTOR_FORMAT}: made by an incompatible release tool"
            )
        if target != TARGET_NODE or flags != 0:
            raise MalformedReleaseError(f"descriptor target {target} / flags {flags} unsupported")
        raw_name = bytes(name).rstrip(b"\0")
        if b"\0" in raw_name:
            raise MalformedReleaseError("descriptor model name has embedded NUL bytes")
        try:
            text = raw_name.decode("ascii")
        except UnicodeDecodeError as exc:
            raise MalformedReleaseError("descriptor model name is not ASCII") from exc
        return cls(
            model_name=text,
            model_version=version,
            image_size=size,
            image_sha256=bytes(sha),
            window_length=window,
            arena_bytes=arena,
        )
