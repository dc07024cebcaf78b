"""Create, sign and publish model releases (the gateway verifies them:
tesla_gateway/ota/release.py).

``keygen`` makes an Ed25519 key pair (private seed in hex, mode 0600; public key in hex),
``build_release`` signs a model directory into a release directory for one target, and
``push_release`` publishes it retained on MQTT, where every gateway subscribed to releases
picks it up (node releases are relayed to the gateway's serial-attached nodes).

A gateway release also carries golden windows (tesla_gateway/ota/golden.py): a few windows spread
over the model's training input range and what LiteRT computes for them on the float graph,
which every gateway reproduces before it switches to the release. A release may be limited to
some gateways (``rollout``: ids or ``[ota] groups``), for a canary first.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from nacl.signing import SigningKey
from pydantic import ValidationError

from tesla_gateway.contract.manifest import (
    MANIFEST_FILENAME,
    Manifest,
    load_manifest,
    verify_model_files,
)
from tesla_gateway.contract.time_of_day import HOUR_CHANNELS, window_hours
from tesla_gateway.errors import GatewayError
from tesla_gateway.mqtt.config import MqttBrokerConfig, MqttTlsConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttError
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.golden import GOLDEN_FILENAME, GoldenWindows
from tesla_gateway.ota.release import (
    RELEASE_FILENAME,
    RELEASE_FORMAT_VERSION,
    Rollout,
    Target,
    encode_bundle,
    key_id,
    read_release_dir,
    signed_bytes,
    verify_release,
)
from training.errors import TrainingError

__all__ = [
    "DEFAULT_TOPIC_PREFIX",
    "PRIVATE_KEY_NAME",
    "PUBLIC_KEY_NAME",
    "KeyPair",
    "ReleaseError",
    "broker_from_flags",
    "build_release",
    "golden_windows",
    "keygen",
    "load_private_key",
    "push_release",
    "release_topic",
]

PRIVATE_KEY_NAME = "release_key.ed25519"
PUBLIC_KEY_NAME = "release_key.pub"
DEFAULT_TOPIC_PREFIX = "tesla/releases"


class ReleaseError(TrainingError):
    """A key or release could not be created or published; the message says what to fix."""


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    key_id: str


def keygen(out_dir: Path) -> KeyPair:
    """Write a new key pair into ``out_dir``; never overwrite an existing key."""
    private_path = out_dir / PRIVATE_KEY_NAME
    public_path = out_dir / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise ReleaseError(
                f"{path} already exists; refusing to overwrite a key (releases signed with it "
                "would no longer verify). Choose another --out or remove it deliberately"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    signing = SigningKey.generate()
    public = bytes(signing.verify_key)
    # O_EXCL + 0600 from the start: the seed is never readable by others, not even briefly.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(bytes(signing).hex() + "\n")
    public_path.write_text(public.hex() + "\n", encoding="ascii")
    return KeyPair(private_path=private_path, public_path=public_path, key_id=key_id(public))


def load_private_key(path: Path) -> SigningKey:
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"cannot read private key {path}: {exc}") from exc
    if mode & 0o077:
        raise ReleaseError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
    try:
        seed = bytes.fromhex(text)
    except ValueError as exc:
        raise ReleaseError(f"{path} is not a hex private key written by keygen") from exc
    if len(seed) != 32:
        raise ReleaseError(f"{path} holds {len(seed)} bytes; an Ed25519 seed has 32")
    return SigningKey(seed)


def _files_for(model_dir: Path, target: Target) -> tuple[dict[str, bytes], str | None]:
    manifest = load_manifest(model_dir)
    verify_model_files(model_dir, manifest)
    files = {MANIFEST_FILENAME: (model_dir / MANIFEST_FILENAME).read_bytes()}
    if target == "gateway":
        for entry in manifest.files.values():
            files[entry.path] = (model_dir / entry.path).read_bytes()
        return files, None
    # A covariate model goes to nodes too: only a firmware built for it (its name, hence its
    # channels) accepts the release (the node's receiver compares the model name).
    device = manifest.files.get("int8")
    if device is None or device.batch != 1:
        why = f": {manifest.device_graph_absent}" if manifest.device_graph_absent else ""
        raise ReleaseError(f"{model_dir} has no batch-1 int8 device graph for a node release{why}")
    if device.tflm_arena_bytes is None:
        raise ReleaseError(f"{model_dir}: the int8 file has no measured tflm_arena_bytes")
    files[device.path] = (model_dir / device.path).read_bytes()
    return files, device.path


def _golden_inputs(manifest: Manifest, shape: tuple[int, ...]) -> np.ndarray:
    """Six windows [6, N(, C)] over the training input range: constant low, median and high,
    a rising ramp, a seeded random walk and a median window ending in a spike."""
    n = manifest.window_length
    low, mid, high = manifest.input_range.p01, manifest.input_range.p50, manifest.input_range.p99
    rng = np.random.default_rng(20_251_123)
    walk = np.clip(mid + np.cumsum(rng.normal(0, (high - low) / 40, n)), low, high)
    spike = np.full(n, mid)
    spike[-1] = manifest.input_range.max
    first = np.stack(
        [np.full(n, low), np.full(n, mid), np.full(n, high), np.linspace(low, high, n), walk, spike]
    )  # [6, N] in the feature's unit
    if len(shape) == 1:
        windows = first
    else:
        windows = rng.uniform(0, 100, (len(first), *shape))  # covariates
        windows[..., 0] = first
    # Multiples of 1/16: exact in float32 and short in JSON.
    windows = (np.round(windows * 16) / 16).astype(np.float32)
    if len(shape) > 1:
        _real_hours(windows, manifest)
    return windows


def _real_hours(windows: np.ndarray, manifest: Manifest) -> None:
    """Hour channels hold hours (the contract's rule, windows ending at six times of day four
    hours apart), not made-up covariates: a release is judged on inputs a model can meet."""
    names = manifest.channel_names
    if HOUR_CHANNELS[0] not in names:
        return
    days = 86_400 // manifest.period_seconds
    newest = 1_000 * days + np.arange(len(windows)) * max(1, days // 6)
    sin, cos = window_hours(windows[..., 0], newest, manifest.period_seconds, 0)
    windows[..., names.index(HOUR_CHANNELS[0])] = sin
    windows[..., names.index(HOUR_CHANNELS[1])] = cos


def golden_windows(model_dir: Path) -> bytes:
    """``golden.json`` for a gateway release: LiteRT on the float graph, one batched invoke."""
    from tesla_gateway.models.calibrator import Calibrator
    from tesla_gateway.models.trust import ModelTrust

    try:
        calibrator = Calibrator.load(model_dir, ("ai_edge_litert",), trust=ModelTrust("off"))
    except GatewayError as exc:
        raise ReleaseError(f"{model_dir} does not load under LiteRT: {exc}") from exc
    windows = _golden_inputs(calibrator.manifest, calibrator.input_shape)
    expected = calibrator.calibrate(windows)
    if not np.isfinite(expected).all():
        raise ReleaseError(f"{model_dir}: the model returns {expected} on the golden windows")
    golden = GoldenWindows(
        runtime=f"{calibrator.runtime_name} {calibrator.runtime_version}",
        windows=windows.tolist(),
        expected=[float(value) for value in expected],
    )
    return (golden.model_dump_json() + "\n").encode("utf-8")


def build_release(
    model_dir: Path,
    target: Target,
    private_key: Path,
    out_dir: Path,
    *,
    rollout: Rollout | None = None,
) -> Path:
    """Sign ``model_dir`` into ``out_dir`` (created; must not exist or be empty); ``rollout``
    limits it to some gateways (signed with the rest)."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ReleaseError(f"{out_dir} is not empty; releases are never overwritten")
    if rollout is not None and not (rollout.gateways or rollout.groups):
        raise ReleaseError("a rollout must name at least one gateway or group")
    signing = load_private_key(private_key)
    public = bytes(signing.verify_key)
    manifest = load_manifest(model_dir)
    files, image_name = _files_for(model_dir, target)
    if target == "gateway":
        files[GOLDEN_FILENAME] = golden_windows(model_dir)
    document: dict[str, object] = {
        "format_version": RELEASE_FORMAT_VERSION,
        "model": manifest.name,
        "version": manifest.version,
        "feature": manifest.feature,
        "target": target,
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in sorted(files.items())
        },
        "key_id": key_id(public),
    }
    if rollout is not None:
        document["rollout"] = rollout.model_dump()
    if image_name is not None:
        image = files[image_name]
        arena = manifest.files["int8"].tflm_arena_bytes
        descriptor = ImageDescriptor.of_image(manifest, image, arena_bytes=arena or 0).encode()
        document["node_image"] = {
            "file": image_name,
            "descriptor": base64.b64encode(descriptor).decode("ascii"),
            "signature": base64.b64encode(signing.sign(descriptor).signature).decode("ascii"),
        }
    document["signature"] = base64.b64encode(signing.sign(signed_bytes(document)).signature).decode(
        "ascii"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".staging-"))
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / RELEASE_FILENAME).write_text(
            json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        verify_release(staging, public, running_version=None, target=target)  # self-check
        for path in staging.iterdir():
            path.replace(out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def release_topic(prefix: str, target: Target, model: str) -> str:
    """Where a release is published (docs/ota-protocol.md, "Releases on MQTT")."""
    return f"{prefix}/{target}/{model}"


def broker_from_flags(
    broker: str,
    *,
    username: str | None = None,
    password_file: Path | None = None,
    ca_file: Path | None = None,
    protocol: Literal["5", "3.1.1"] = "5",
) -> MqttBrokerConfig:
    """The gateway's broker config from the push flags (``--broker HOST:PORT`` and friends;
    ``--protocol 3.1.1`` for a broker that refuses MQTT 5, e.g. nats-server's MQTT listener)."""
    host, _, port_text = broker.rpartition(":")
    if not host or not port_text.isdigit():
        raise ReleaseError(f"--broker must be HOST:PORT, got {broker!r}")
    try:
        return MqttBrokerConfig(
            host=host,
            port=int(port_text),
            username=username,
            password_file=password_file,
            tls=MqttTlsConfig(ca_file=ca_file) if ca_file is not None else None,
            protocol=protocol,
        )
    except ValidationError as exc:
        problems = "; ".join(str(error["msg"]) for error in exc.errors())
        raise ReleaseError(f"--broker/--username/--password-file/--ca-file: {problems}") from exc


def push_release(
    release_dir: Path, broker: MqttBrokerConfig, *, topic_prefix: str = DEFAULT_TOPIC_PREFIX
) -> str:
    """Publish the release retained (QoS 1) and wait for the broker's acknowledgement.

    Through the gateway's own MQTT connection, so push speaks the same protocol version, TLS
    and credentials (``password_file`` read at connect) as the daemons it releases to.
    """
    document, files = read_release_dir(release_dir)
    target = document.get("target")
    model = document.get("model")
    if target not in ("gateway", "node") or not isinstance(model, str):
        raise ReleaseError(f"{release_dir / RELEASE_FILENAME} names no valid target and model")
    payload = encode_bundle((release_dir / RELEASE_FILENAME).read_bytes(), files)
    topic = release_topic(topic_prefix, target, model)
    asyncio.run(_publish_retained(broker, topic, payload))
    return topic


async def _publish_retained(broker: MqttBrokerConfig, topic: str, payload: bytes) -> None:
    address = f"{broker.host}:{broker.port}"
    timeout_s = broker.connect_timeout_s
    connection = MqttConnection(broker, client_id="", clean_start=True, name="release-push")
    async with connection:
        try:
            async with asyncio.timeout(timeout_s):
                await connection.wait_connected()
        except TimeoutError:
            raise ReleaseError(
                f"cannot connect to the broker {address} within {timeout_s} s, or it refused "
                "the connection (the mqtt_connect_failed log line says which): check --broker, "
                "--username/--password-file and TLS"
            ) from None
        try:
            async with asyncio.timeout(timeout_s):
                await connection.publish(topic, payload, qos=1, retain=True)
        except (TimeoutError, MqttError) as exc:
            raise ReleaseError(
                f"the broker {address} did not accept the release on {topic} within "
                f"{timeout_s} s ({exc or 'no acknowledgement'}); check its ACLs"
            ) from exc
