"""keygen / release / push: real Ed25519 keys, real release directories, real mosquitto."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import SecretStr

from devkit.broker import Mosquitto
from tesla_gateway.models.calibrator import Calibrator
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.ota.descriptor import DESCRIPTOR_SIZE, ImageDescriptor
from tesla_gateway.ota.errors import BadSignatureError
from tesla_gateway.ota.golden import GOLDEN_FILENAME, check_golden, parse_golden
from tesla_gateway.ota.release import (
    RELEASE_FILENAME,
    decode_bundle,
    load_public_key,
    verify_release,
)
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit
from training.cli import main
from training.release import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, ReleaseError, keygen


def test_keygen_writes_private_key_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    assert main(["keygen", "--out", str(tmp_path)]) == 0
    private = tmp_path / PRIVATE_KEY_NAME
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert len(load_public_key(tmp_path / PUBLIC_KEY_NAME)) == 32
    before = private.read_bytes()
    with pytest.raises(ReleaseError, match="refusing to overwrite"):
        keygen(tmp_path)
    assert main(["keygen", "--out", str(tmp_path)]) == 2
    assert private.read_bytes() == before


def test_release_cli_writes_a_verifiable_node_release(tmp_path: Path) -> None:
    keys = keygen(tmp_path / "keys")
    out = tmp_path / "rel"
    code = main(
        ["release", "--model", str(DEFAULT_NODE_MODEL), "--target", "node",
         "--key", str(keys.private_path), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "model_int8.tflite", RELEASE_FILENAME]
    release = verify_release(out, load_public_key(keys.public_path), running_version=None)
    assert release.target == "node"
    descriptor = ImageDescriptor.decode(release.descriptor)
    assert len(release.descriptor) == DESCRIPTOR_SIZE
    assert descriptor.window_length == 360
    assert descriptor.image_size == len(release.node_image)
    assert descriptor.arena_bytes == release.manifest.files["int8"].tflm_arena_bytes


def test_a_covariate_model_is_released_to_nodes_and_gateways(tmp_path: Path) -> None:
    """A node built for the covariate model (firmware-constants with its three channels) takes
    its releases: the node release carries the int8 graph of [1, N, 3] and the descriptor the
    node's receiver checks by model name; the gateway release carries both graphs."""
    from tesla_gateway.contract.manifest import load_manifest
    from training.firmware_constants import render_model_constants

    covariate = DEFAULT_NODE_MODEL.parent / "pm10-ispra-1min-rh-temp"
    keys = keygen(tmp_path / "keys")
    args = ["release", "--model", str(covariate), "--key", str(keys.private_path)]
    assert main([*args, "--target", "node", "--out", str(tmp_path / "node")]) == 0
    node = verify_release(tmp_path / "node", load_public_key(keys.public_path), None)
    descriptor = ImageDescriptor.decode(node.descriptor)
    assert descriptor.model_name == "pm10-ispra-1min-rh-temp"
    assert descriptor.image_size == load_manifest(covariate).files["int8"].size_bytes
    assert main([*args, "--target", "gateway", "--out", str(tmp_path / "gw")]) == 0
    release = verify_release(tmp_path / "gw", load_public_key(keys.public_path), None)
    assert release.manifest.channel_names == ("pm10", "rh", "temp_c")
    header = render_model_constants(load_manifest(covariate), "pm10-ispra-1min-rh-temp")
    assert "kChannelCount = 3u" in header


def test_gateway_release_carries_every_flatbuffer(tmp_path: Path) -> None:
    kit = ReleaseKit(tmp_path)
    out = kit.release(kit.base_version + 1, "gateway")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        GOLDEN_FILENAME,
        "manifest.json",
        "model.tflite",
        "model_int8.tflite",
        RELEASE_FILENAME,
    ]
    release = verify_release(out, kit.public_key, kit.base_version)
    assert release.version == kit.base_version + 1
    # The golden windows are signed with the rest, span the training range, and the model
    # reproduces them.
    golden = parse_golden(release.files[GOLDEN_FILENAME])
    windows = np.asarray(golden.windows)
    manifest = release.manifest
    assert windows.shape == (6, manifest.window_length)
    assert windows.min() <= manifest.input_range.p01 + 0.1
    assert windows.max() >= manifest.input_range.p99 - 0.1
    assert len(set(golden.expected)) == 6  # six different answers: a real check
    assert golden.runtime.startswith("ai_edge_litert")
    assert check_golden(Calibrator.load(out), golden) <= 1e-4


def test_release_names_its_rollout_inside_the_signature(tmp_path: Path) -> None:
    keys = keygen(tmp_path / "keys")
    out = tmp_path / "canary"
    argv = ["release", "--model", str(DEFAULT_NODE_MODEL), "--target", "gateway"]
    argv += ["--key", str(keys.private_path), "--out", str(out)]
    assert main([*argv, "--gateway", "pi-kitchen", "--group", "canary"]) == 0
    public = load_public_key(keys.public_path)
    release = verify_release(out, public, None)
    assert release.metadata.rollout is not None
    assert release.metadata.rollout.model_dump() == {
        "gateways": ["pi-kitchen"],
        "groups": ["canary"],
    }
    assert release.is_for("pi-kitchen", [])
    assert release.is_for("pi-hall", ["canary", "north"])
    assert not release.is_for("pi-hall", ["north"])
    # Widening the rollout after signing is a forgery.
    document = json.loads((out / RELEASE_FILENAME).read_text())
    document["rollout"]["groups"].append("north")
    (out / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(BadSignatureError):
        verify_release(out, public, None)
    assert main([*argv[:-1], str(tmp_path / "bad"), "--group", "no spaces"]) == 2


def test_release_refuses_a_world_readable_key_and_a_non_empty_out(tmp_path: Path) -> None:
    keys = keygen(tmp_path / "keys")
    keys.private_path.chmod(0o644)
    with pytest.raises(ReleaseError, match="chmod 600"):
        main_release(keys.private_path, tmp_path / "r1")
    keys.private_path.chmod(0o600)
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "x").write_text("x")
    with pytest.raises(ReleaseError, match="not empty"):
        main_release(keys.private_path, tmp_path / "r2")


def main_release(key: Path, out: Path) -> None:
    from training.release import build_release

    build_release(DEFAULT_NODE_MODEL, "node", key, out)


def test_signature_covers_the_metadata(tmp_path: Path) -> None:
    kit = ReleaseKit(tmp_path)
    out = kit.release(kit.base_version + 1)
    document = json.loads((out / RELEASE_FILENAME).read_text())
    document["feature"] = "pm2_5"
    (out / RELEASE_FILENAME).write_text(json.dumps(document))
    with pytest.raises(BadSignatureError):
        verify_release(out, kit.public_key, None)


def test_push_publishes_the_release_retained(tmp_path: Path, mosquitto: Mosquitto) -> None:
    kit = ReleaseKit(tmp_path)
    out = kit.release(kit.base_version + 1)
    code = main(["push", "--release", str(out), "--broker", f"127.0.0.1:{mosquitto.port}"])
    assert code == 0
    # A subscriber arriving later still gets it: the message is retained.
    received: list[paho.MQTTMessage] = []
    got = threading.Event()
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2)

    def on_message(_c: object, _u: object, message: paho.MQTTMessage) -> None:
        received.append(message)
        got.set()

    client.on_message = on_message
    client.connect("127.0.0.1", mosquitto.port)
    client.subscribe("tesla/releases/#", qos=1)
    client.loop_start()
    try:
        assert got.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    assert received[0].topic == "tesla/releases/node/pm10-ispra-1min"
    assert received[0].retain
    payload = bytes(received[0].payload)
    release = verify_release(payload, kit.public_key, kit.base_version)
    assert release.version == kit.base_version + 1
    document, files = decode_bundle(payload)
    assert set(files) == {"manifest.json", "model_int8.tflite"}
    assert document["target"] == "node"


def test_push_to_a_dead_broker_fails_with_a_message(tmp_path: Path) -> None:
    from devkit.broker import free_port

    kit = ReleaseKit(tmp_path)
    out = kit.release(kit.base_version + 1)
    with pytest.raises(ReleaseError, match="cannot connect"):
        from training.release import push_release

        push_release(out, MqttBrokerConfig(port=free_port(), connect_timeout_s=1.0))


def test_push_with_credentials_and_a_refusal(tmp_path: Path) -> None:
    from training.release import push_release

    broker = Mosquitto(tmp_path / "auth-broker", users={"ci": "s3cret"})
    broker.start()
    try:
        kit = ReleaseKit(tmp_path)
        out = kit.release(kit.base_version + 1)
        secret = tmp_path / "password"
        secret.write_text("s3cret\n")
        code = main(
            ["push", "--release", str(out), "--broker", f"127.0.0.1:{broker.port}",
             "--username", "ci", "--password-file", str(secret)]
        )  # fmt: skip
        assert code == 0
        wrong = MqttBrokerConfig(
            port=broker.port, username="ci", password=SecretStr("wrong"), connect_timeout_s=1.0
        )
        with pytest.raises(ReleaseError, match="refused the connection"):
            push_release(out, wrong)
    finally:
        broker.stop()
