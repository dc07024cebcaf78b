"""The node image descriptor: the 88 signed bytes a node checks before and after a transfer.

A microcontroller cannot cheaply parse and canonicalise JSON, so a node release carries a small
fixed-layout binary statement signed (Ed25519) with the same release key: which model, which
version, how many bytes, their sha256, the window length and arena the model needs, and from
how many periods of history it calibrates a young window. The node checks the signature at the
handshake (refusing a wrong key, a downgrade or a model that does not fit before a byte is
transferred) and the sha256 after the last chunk, and keeps the descriptor with the slot's boot
record, so the young-window rule travels with the image it belongs to. Layout (little endian),
mirrored in firmware/src/ota_descriptor.h::

    offset size field
    0      4    magic "TMDL"
    4      1    descriptor format (2; 1 from release tools before min_history)
    5      1    target (1 = node)
    6      2    format 2: min_history_periods (1..N); format 1: flags, 0
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
    "LEGACY_DESCRIPTOR_FORMAT",
    "TARGET_NODE",
    "ImageDescriptor",
]

DESCRIPTOR_MAGIC = b"TMDL"
DESCRIPTOR_FORMAT = 2  # what this tool writes: it states min_history_periods
LEGACY_DESCRIPTOR_FORMAT = 1  # states nothing about young windows: a node calibrates whole ones
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
    # Periods of history from which the model calibrates a young window (the manifest's
    # calibrates_from); None for a format 1 descriptor, which says nothing (whole windows).
    min_history_periods: int | None = None

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
        history = self.min_history_periods
        if history is not None and not 1 <= history <= min(self.window_length, 2**16 - 1):
            raise MalformedReleaseError(
                f"min_history_periods {history} must be within 1..N = {self.window_length} "
                "(and fit in 16 bits): re-create the release from a valid manifest"
            )

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
            min_history_periods=manifest.calibrates_from,
        )

    @property
    def format(self) -> int:
        """2 when the descriptor states min_history_periods, 1 when it does not."""
        return LEGACY_DESCRIPTOR_FORMAT if self.min_history_periods is None else DESCRIPTOR_FORMAT

    def encode(self) -> bytes:
        return _LAYOUT.pack(
            DESCRIPTOR_MAGIC,
            self.format,
            TARGET_NODE,
            self.min_history_periods or 0,
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
        magic, fmt, target, word, version, size, sha, name, window, arena = _LAYOUT.unpack(data)
        if magic != DESCRIPTOR_MAGIC or fmt not in {LEGACY_DESCRIPTOR_FORMAT, DESCRIPTOR_FORMAT}:
            raise MalformedReleaseError(
                f"descriptor magic/format {magic!r}/{fmt} is not {DESCRIPTOR_MAGIC!r}/"
                f"{LEGACY_DESCRIPTOR_FORMAT} or {DESCRIPTOR_FORMAT}: made by an incompatible "
                "release tool"
            )
        if target != TARGET_NODE or (fmt == LEGACY_DESCRIPTOR_FORMAT and word != 0):
            raise MalformedReleaseError(
                f"descriptor target {target} / format {fmt} flags {word} unsupported"
            )
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
            min_history_periods=word if fmt == DESCRIPTOR_FORMAT else None,
        )
