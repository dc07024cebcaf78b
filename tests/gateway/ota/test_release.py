"""verify_release: each way a release can be wrong has its own error and an actionable reason."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tesla_gateway.contract.manifest import load_manifest, verify_model_files
from tesla_gateway.models.watch import ModelSet, ReloadOutcome
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.errors import (
    BadSignatureError,
    DowngradeError,
    IncompatibleReleaseError,
    MalformedReleaseError,
    OtaError,
    ReleaseRejectedError,
    ShaMismatchError,
    SizeMismatchError,
    UnknownKeyError,
    WrongTargetError,
)
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import (
    RELEASE_FILENAME,
    Rollout,
    canonical_json,
    decode_bundle,
    encode_bundle,
    load_public_key,
    read_release_dir,
    signed_bytes,
    verify_release,
)
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit
from training.release import keygen, load_private_key


def _copy(release: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(release, target)
    return target


def test_a_good_release_verifies_from_a_directory_and_from_a_bundle(
    release_kit: ReleaseKit,
) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    from_dir = verify_release(path, release_kit.public_key, release_kit.base_version)
    bundle = encode_bundle((path / RELEASE_FILENAME).read_bytes(), read_release_dir(path)[1])
    from_bundle = verify_release(bundle, release_kit.public_key, release_kit.base_version)
    assert from_dir.metadata == from_bundle.metadata
    assert from_dir.node_image == from_bundle.node_image


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        ("flip_image_byte", ShaMismatchError),
        ("truncate_image", SizeMismatchError),
        ("edit_metadata", BadSignatureError),
        ("drop_file", MalformedReleaseError),
        ("extra_file", MalformedReleaseError),
        ("not_json", MalformedReleaseError),
        ("future_format", MalformedReleaseError),
    ],
)
def test_damaged_releases_are_rejected_by_cause(
    release_kit: ReleaseKit, tmp_path: Path, damage: str, error: type[ReleaseRejectedError]
) -> None:
    path = _copy(release_kit.release(release_kit.base_version + 1), tmp_path)
    image = path / "model_int8.tflite"
    meta = path / RELEASE_FILENAME
    if damage == "flip_image_byte":
        data = bytearray(image.read_bytes())
        data[100] ^= 0x01
        image.write_bytes(bytes(data))
    elif damage == "truncate_image":
        image.write_bytes(image.read_bytes()[:-1])
    elif damage == "edit_metadata":
        document = json.loads(meta.read_text())
        document["version"] += 1
        meta.write_text(json.dumps(document))
    elif damage == "drop_file":
        image.unlink()
    elif damage == "extra_file":
        document = json.loads(meta.read_text())
        files = read_release_dir(path)[1]
        files["evil.tflite"] = b"x"
        bundle = encode_bundle(json.dumps(document).encode(), files)
        with pytest.raises(error) as caught:
            verify_release(bundle, release_kit.public_key, None)
        assert "not covered by the signature" in str(caught.value)
        return
    elif damage == "not_json":
        meta.write_text("{")
    elif damage == "future_format":
        document = json.loads(meta.read_text())
        document["format_version"] = 2
        meta.write_text(json.dumps(document))
    with pytest.raises(error) as caught:
        verify_release(path, release_kit.public_key, None)
    assert caught.value.reason == error.reason


def test_a_release_signed_by_another_key(release_kit: ReleaseKit, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other")
    path = release_kit.release(release_kit.base_version + 1, key=other.private_path)
    with pytest.raises(UnknownKeyError, match="configure its public key"):
        verify_release(path, release_kit.public_key, None)


def test_a_forged_signature_under_the_trusted_key_id(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    path = _copy(release_kit.release(release_kit.base_version + 1), tmp_path)
    document = json.loads((path / RELEASE_FILENAME).read_text())
    document["signature"] = base64.b64encode(bytes(64)).decode()
    (path / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(BadSignatureError, match="altered after signing"):
        verify_release(path, release_kit.public_key, None)


def test_a_node_image_descriptor_signed_by_another_key(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    """The release is signed by the trusted key, the descriptor the node checks is not: the
    gateway must refuse it rather than relay an image every node would reject."""
    path = _copy(release_kit.release(release_kit.base_version + 1), tmp_path)
    document = json.loads((path / RELEASE_FILENAME).read_text())
    descriptor = base64.b64decode(document["node_image"]["descriptor"])
    other = load_private_key(keygen(tmp_path / "other").private_path)
    document["node_image"]["signature"] = base64.b64encode(
        other.sign(descriptor).signature
    ).decode()
    trusted = load_private_key(release_kit.keys.private_path)
    document["signature"] = base64.b64encode(
        trusted.sign(signed_bytes(document)).signature
    ).decode()
    (path / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(BadSignatureError, match="node image descriptor"):
        verify_release(path, release_kit.public_key, None)


def test_downgrades_and_equal_versions_need_the_operator(release_kit: ReleaseKit) -> None:
    path = release_kit.release(release_kit.base_version)
    with pytest.raises(DowngradeError, match="not newer"):
        verify_release(path, release_kit.public_key, release_kit.base_version)
    with pytest.raises(DowngradeError):
        verify_release(path, release_kit.public_key, release_kit.base_version + 5)
    forced = verify_release(
        path, release_kit.public_key, release_kit.base_version + 5, allow_downgrade=True
    )
    assert forced.version == release_kit.base_version


def test_target_is_checked(release_kit: ReleaseKit) -> None:
    path = release_kit.release(release_kit.base_version + 1, "node")
    with pytest.raises(WrongTargetError, match="--target gateway"):
        verify_release(path, release_kit.public_key, None, target="gateway")


def test_install_is_picked_up_by_the_hot_reload(release_kit: ReleaseKit, tmp_path: Path) -> None:
    model_dir = tmp_path / "serving"
    shutil.copytree(DEFAULT_NODE_MODEL, model_dir)
    models = ModelSet({"pm10": model_dir})
    assert models.refresh(force=True)[0].outcome is ReloadOutcome.LOADED
    release = verify_release(
        release_kit.release(release_kit.base_version + 1, "gateway"),
        release_kit.public_key,
        release_kit.base_version,
        target="gateway",
    )
    install_release(release, model_dir, "pm10")
    verify_model_files(model_dir / "current", load_manifest(model_dir / "current"))
    results = models.refresh()
    assert [(r.outcome, r.version) for r in results] == [
        (ReloadOutcome.LOADED, release_kit.base_version + 1)
    ]
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]  # no temp leftovers
    with pytest.raises(IncompatibleReleaseError):
        install_release(release, model_dir, "pm2_5")


@given(
    name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}", fullmatch=True),
    version=st.integers(0, 2**32 - 1),
    size=st.integers(0, 2**32 - 1),
    sha=st.binary(min_size=32, max_size=32),
    window=st.integers(0, 2**32 - 1),
    arena=st.integers(0, 2**32 - 1),
)
def test_descriptor_round_trips(  # noqa: PLR0917 - one argument per descriptor field
    name: str, version: int, size: int, sha: bytes, window: int, arena: int
) -> None:
    descriptor = ImageDescriptor(name, version, size, sha, window, arena)
    assert ImageDescriptor.decode(descriptor.encode()) == descriptor


@given(st.binary(max_size=120))
def test_descriptor_decode_never_crashes(data: bytes) -> None:
    with contextlib.suppress(MalformedReleaseError):
        ImageDescriptor.decode(data)


def _descriptor_bytes(**fields: object) -> bytes:
    values: dict[str, object] = {
        "magic": b"TMDL", "fmt": 1, "target": 1, "flags": 0, "version": 2, "size": 100,
        "sha": bytes(32), "name": b"pm10".ljust(32, b"\0"), "window": 360, "arena": 1000,
    }  # fmt: skip
    values.update(fields)
    return struct.pack("<4sBBHII32s32sII", *values.values())


def test_a_descriptor_is_refused_for_any_one_wrong_header_field() -> None:
    assert ImageDescriptor.decode(_descriptor_bytes()).model_name == "pm10"
    for wrong in ({"magic": b"XMDL"}, {"fmt": 2}, {"target": 2}, {"flags": 1}):
        with pytest.raises(MalformedReleaseError):
            ImageDescriptor.decode(_descriptor_bytes(**wrong))
    with pytest.raises(MalformedReleaseError, match="NUL"):
        ImageDescriptor.decode(_descriptor_bytes(name=b"pm\0" + b"10".ljust(29, b"\0")))


def test_descriptor_fields_must_fit_32_bits() -> None:
    sha = bytes(32)
    ImageDescriptor("m", 2**32 - 1, 2**32 - 1, sha, 2**32 - 1, 2**32 - 1)
    labels = ("model version", "image size", "window length", "arena bytes")
    for field, label in enumerate(labels):
        values = [1, 1, 1, 1]
        values[field] = 2**32
        with pytest.raises(MalformedReleaseError, match=f"^{label} 4294967296 does not fit"):
            ImageDescriptor("m", values[0], values[1], sha, values[2], values[3])


def test_bundles_and_signatures_must_be_strict_base64(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    release_json = (path / RELEASE_FILENAME).read_bytes()
    bundle = json.loads(encode_bundle(release_json, read_release_dir(path)[1]))
    name = next(iter(bundle["files"]))
    bundle["files"][name] = "!" + bundle["files"][name]  # a character base64 does not have
    with pytest.raises(MalformedReleaseError, match="not a release bundle"):
        verify_release(json.dumps(bundle).encode(), release_kit.public_key, None)
    for broken in ('{"release": [], "files": {}}', '{"release": {}, "files": []}'):
        with pytest.raises(MalformedReleaseError, match="must be objects"):
            decode_bundle(broken.encode())
    copy = _copy(path, tmp_path)
    document = json.loads((copy / RELEASE_FILENAME).read_text())
    document["signature"] = "!" + document["signature"]
    (copy / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(MalformedReleaseError, match="release signature is not base64"):
        verify_release(copy, release_kit.public_key, None)


def test_a_public_key_file_holds_32_bytes_in_hex(release_kit: ReleaseKit, tmp_path: Path) -> None:
    assert load_public_key(release_kit.keys.public_path) == release_kit.public_key
    short = tmp_path / "short.pub"
    short.write_text("ab" * 33 + "\n", encoding="ascii")
    with pytest.raises(OtaError, match="holds 33 bytes"):
        load_public_key(short)


def test_a_rollout_names_gateways_or_groups() -> None:
    rollout = Rollout(gateways=["gw-b", "gw-a"], groups=["north"])
    assert rollout.includes("gw-a", []) and rollout.includes("gw-z", ["south", "north"])
    assert not rollout.includes("gw-z", ["south"])
    assert rollout.describe() == "gateways ['gw-a', 'gw-b'] and groups ['north']"
    assert Rollout(groups=["north"]).describe() == "groups ['north']"
    assert Rollout().describe() == "no gateway"


def test_a_verified_release_says_which_gateways_it_is_for(release_kit: ReleaseKit) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    release = verify_release(path, release_kit.public_key, None)
    assert release.is_for("any", [])  # no rollout: every gateway
    limited = dataclasses.replace(
        release,
        metadata=release.metadata.model_copy(update={"rollout": Rollout(groups=["north"])}),
    )
    assert limited.is_for("gw", ["north"]) and not limited.is_for("gw", ["south"])


# -- what verification promises beyond the damage cases (survivors of make mutation) -----------


def _resign(path: Path, release_kit: ReleaseKit, edit: dict[str, object], into: Path) -> Path:
    """A copy of a release with fields of release.json replaced and signed again."""
    shutil.copytree(path, into)
    document = json.loads((into / RELEASE_FILENAME).read_text(encoding="utf-8"))
    for key, value in edit.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            document[key] = {**document[key], **value}
        else:
            document[key] = value
    signing = load_private_key(release_kit.keys.private_path)
    document["signature"] = base64.b64encode(
        signing.sign(signed_bytes(document)).signature
    ).decode()
    (into / RELEASE_FILENAME).write_text(json.dumps(document), encoding="utf-8")
    return into


def test_the_signed_form_is_sorted_compact_ascii_json() -> None:
    document = {"b": [1, 2], "a": {"z": "é", "y": None}}
    assert canonical_json(document) == b'{"a":{"y":null,"z":"\\u00e9"},"b":[1,2]}'


def test_a_verified_release_keeps_release_json_in_its_signed_form(
    release_kit: ReleaseKit,
) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    release = verify_release(path, release_kit.public_key, None)
    document = json.loads((path / RELEASE_FILENAME).read_text(encoding="utf-8"))
    assert release.release_json == canonical_json(document)


def test_a_gateway_release_missing_a_file_its_manifest_lists_is_refused(
    release_kit: ReleaseKit,
) -> None:
    base = release_kit.release(release_kit.base_version + 1, "gateway")
    lacking = release_kit.resigned(base, "gateway-without-int8", {"model_int8.tflite": None})
    with pytest.raises(MalformedReleaseError, match="needs every file its manifest lists"):
        verify_release(lacking, release_kit.public_key, None)


def test_a_node_image_descriptor_must_be_strict_base64(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    descriptor = json.loads((path / RELEASE_FILENAME).read_text())["node_image"]["descriptor"]
    loose = _resign(
        path, release_kit, {"node_image": {"descriptor": "!" + descriptor}}, tmp_path / "r"
    )
    with pytest.raises(MalformedReleaseError, match="node image descriptor is not base64"):
        verify_release(loose, release_kit.public_key, None)


def test_release_metadata_of_the_wrong_shape_is_malformed(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    path = _copy(release_kit.release(release_kit.base_version + 1), tmp_path)
    document = json.loads((path / RELEASE_FILENAME).read_text())
    document["version"] = "two"
    (path / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(
        MalformedReleaseError, match=r"^release\.json is not a valid release: version"
    ):
        verify_release(path, release_kit.public_key, None)
    document["files"] = 5  # not even a list of names to read
    (path / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(MalformedReleaseError):
        verify_release(path, release_kit.public_key, None)


def test_a_public_key_file_must_be_ascii(release_kit: ReleaseKit, tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.pub"
    hex_key = release_kit.keys.public_path.read_text(encoding="ascii").strip()
    wrapped.write_text("\u00a0" + hex_key + "\u2003\n", encoding="utf-8")  # Unicode spaces
    with pytest.raises(OtaError, match="cannot read the release public key"):
        load_public_key(wrapped)


def test_a_rollout_by_gateway_id_alone(release_kit: ReleaseKit) -> None:
    path = release_kit.release(release_kit.base_version + 1)
    release = verify_release(path, release_kit.public_key, None)
    limited = dataclasses.replace(
        release,
        metadata=release.metadata.model_copy(update={"rollout": Rollout(gateways=["gw-a"])}),
    )
    assert limited.is_for("gw-a", []) and not limited.is_for("gw-b", [])


def test_a_model_name_ending_in_any_letter_round_trips() -> None:
    descriptor = ImageDescriptor("PM10-MODELX", 3, 100, bytes(32), 360, 1000)
    assert ImageDescriptor.decode(descriptor.encode()).model_name == "PM10-MODELX"


def test_a_bundle_may_be_twice_the_largest_file_and_no_larger(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    """The size guard runs before parsing: a valid bundle of exactly 32 MiB verifies, one byte
    more is refused unread (two signed 11.9 MiB files make it that large)."""
    base = release_kit.release(release_kit.base_version + 1)
    big = bytes(range(256)) * (12_500_000 // 256)
    path = release_kit.resigned(base, "release-32mib", {"big-1.bin": big, "big-2.bin": big[1:]})
    bundle = encode_bundle((path / RELEASE_FILENAME).read_bytes(), read_release_dir(path)[1])
    limit = 2 * 16 * 1024 * 1024
    assert len(bundle) <= limit
    exact = bundle + b" " * (limit - len(bundle))  # JSON allows trailing whitespace
    assert verify_release(exact, release_kit.public_key, None).files["big-1.bin"] == big
    with pytest.raises(MalformedReleaseError, match="too large"):
        verify_release(exact + b" ", release_kit.public_key, None)
