"""The node image descriptor carries the young-window rule (min_history_periods, format 2).

A node applies the rule of the image it runs; an OTA image's only source for it is the signed
descriptor, so the release tool must write the manifest's value, the gateway must refuse one
outside 1..N or one that disagrees with the manifest, and a format 1 descriptor (a release tool
before this field) must still verify, meaning "whole windows only" to a node.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tesla_gateway.ota.descriptor import (
    DESCRIPTOR_FORMAT,
    LEGACY_DESCRIPTOR_FORMAT,
    ImageDescriptor,
)
from tesla_gateway.ota.errors import MalformedReleaseError
from tesla_gateway.ota.release import RELEASE_FILENAME, signed_bytes, verify_release
from tests.support.releases import ReleaseKit
from training.release import load_private_key

N = 360  # the default node model's window length


def _raw(fmt: int, word: int, window: int = N) -> bytes:
    name = b"pm10".ljust(32, b"\0")
    return struct.pack(
        "<4sBBHII32s32sII", b"TMDL", fmt, 1, word, 2, 100, bytes(32), name, window, 1
    )


@st.composite
def _descriptors(draw: st.DrawFn) -> ImageDescriptor:
    window = draw(st.integers(1, 2**32 - 1))
    history = draw(st.none() | st.integers(1, min(window, 2**16 - 1)))
    return ImageDescriptor(
        model_name=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}", fullmatch=True)),
        model_version=draw(st.integers(0, 2**32 - 1)),
        image_size=draw(st.integers(0, 2**32 - 1)),
        image_sha256=draw(st.binary(min_size=32, max_size=32)),
        window_length=window,
        arena_bytes=draw(st.integers(0, 2**32 - 1)),
        min_history_periods=history,
    )


@given(_descriptors())
def test_a_descriptor_round_trips_with_or_without_min_history(
    descriptor: ImageDescriptor,
) -> None:
    data = descriptor.encode()
    assert ImageDescriptor.decode(data) == descriptor
    stated = descriptor.min_history_periods is not None
    assert data[4] == (DESCRIPTOR_FORMAT if stated else LEGACY_DESCRIPTOR_FORMAT)
    assert struct.unpack_from("<H", data, 6)[0] == (descriptor.min_history_periods or 0)


def test_min_history_is_read_from_the_formerly_reserved_bytes() -> None:
    assert ImageDescriptor.decode(_raw(2, 1)).min_history_periods == 1
    assert ImageDescriptor.decode(_raw(2, N)).min_history_periods == N
    assert ImageDescriptor.decode(_raw(1, 0)).min_history_periods is None


@pytest.mark.parametrize(
    ("fmt", "word", "why"),
    [
        (2, 0, "min_history_periods 0 must be within 1..N = 360"),
        (2, N + 1, "min_history_periods 361 must be within 1..N = 360"),
        (2, 65535, "min_history_periods 65535 must be within"),
        (1, 1, "format 1 flags 1 unsupported"),
        (3, 1, "magic/format b'TMDL'/3"),
    ],
)
def test_a_bad_min_history_or_format_is_refused(fmt: int, word: int, why: str) -> None:
    with pytest.raises(MalformedReleaseError, match=why.replace("(", r"\(")):
        ImageDescriptor.decode(_raw(fmt, word))


def test_a_value_outside_1_to_n_cannot_be_built_either() -> None:
    fields = {"model_name": "pm10", "model_version": 1, "image_size": 1}
    base = ImageDescriptor(**fields, image_sha256=bytes(32), window_length=24, arena_bytes=1)  # type: ignore[arg-type]
    for wrong in (0, 25):
        with pytest.raises(MalformedReleaseError, match=f"min_history_periods {wrong} must"):
            dataclasses.replace(base, min_history_periods=wrong)


@pytest.mark.parametrize(("manifest_value", "on_the_node"), [(1, 1), (24, 24), (None, N)])
def test_the_release_tool_writes_the_manifests_value(
    release_kit: ReleaseKit, manifest_value: int | None, on_the_node: int
) -> None:
    """None in the manifest (whole windows) is written as N: a node never has to guess."""
    path = release_kit.release(
        release_kit.base_version + 1, manifest_update={"min_history_periods": manifest_value}
    )
    release = verify_release(path, release_kit.public_key, release_kit.base_version)
    assert release.descriptor[4] == DESCRIPTOR_FORMAT
    assert ImageDescriptor.decode(release.descriptor).min_history_periods == on_the_node


def _with_descriptor(release_kit: ReleaseKit, base: Path, tmp_path: Path, raw: bytes) -> Path:
    """A copy of ``base`` whose node descriptor is ``raw``, signed by the trusted key (what
    another release tool holding the key could publish)."""
    path = tmp_path / "changed"
    path.mkdir()
    for item in base.iterdir():
        (path / item.name).write_bytes(item.read_bytes())
    signing = load_private_key(release_kit.keys.private_path)
    document = json.loads((path / RELEASE_FILENAME).read_text())
    document["node_image"]["descriptor"] = base64.b64encode(raw).decode()
    document["node_image"]["signature"] = base64.b64encode(signing.sign(raw).signature).decode()
    signature = signing.sign(signed_bytes(document)).signature
    document["signature"] = base64.b64encode(signature).decode()
    (path / RELEASE_FILENAME).write_text(json.dumps(document))
    return path


def test_a_format_1_release_still_verifies(release_kit: ReleaseKit, tmp_path: Path) -> None:
    """Releases made before format 2 are retained on brokers: they stay valid, and say nothing
    (a node calibrates whole windows from them)."""
    base = release_kit.release(release_kit.base_version + 1)
    current = ImageDescriptor.decode(verify_release(base, release_kit.public_key, None).descriptor)
    legacy = dataclasses.replace(current, min_history_periods=None).encode()
    assert legacy[4] == LEGACY_DESCRIPTOR_FORMAT
    path = _with_descriptor(release_kit, base, tmp_path, legacy)
    release = verify_release(path, release_kit.public_key, None)
    assert ImageDescriptor.decode(release.descriptor).min_history_periods is None


def test_a_descriptor_disagreeing_with_the_manifest_is_refused(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    """The manifest trains whole windows only; a descriptor claiming 1 would have nodes publish
    young-window values the model never learned: the gateway refuses to relay it."""
    base = release_kit.release(
        release_kit.base_version + 1, manifest_update={"min_history_periods": None}
    )
    current = ImageDescriptor.decode(verify_release(base, release_kit.public_key, None).descriptor)
    assert current.min_history_periods == N
    claims_one = dataclasses.replace(current, min_history_periods=1).encode()
    path = _with_descriptor(release_kit, base, tmp_path, claims_one)
    with pytest.raises(MalformedReleaseError, match="does not describe"):
        verify_release(path, release_kit.public_key, None)
