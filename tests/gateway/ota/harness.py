"""A gateway's OTA side in-process (real mosquitto, real SerialSource on a pty, real relay),
with a virtual node on the other end of the pty."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.models.served import ServedVersions
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.ota.descriptor import ImageDescriptor
from tesla_gateway.ota.service import OtaService
from tesla_gateway.sources.serial_source import SerialSource, SerialSourceConfig
from tests.gateway.io.helpers import Collector, broker_config
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit
from tests.support.virtual_node import FirmwareProfile, NodeFaults, VirtualNode

GATEWAY_ID = "gw1"
STATUS_PREFIX = f"tesla/{GATEWAY_ID}/ota"


def default_profile() -> FirmwareProfile:
    manifest = load_manifest(DEFAULT_NODE_MODEL)
    device = manifest.files["int8"]
    assert device.tflm_arena_bytes is not None
    assert device.input_scale is not None
    assert device.output_scale is not None
    return FirmwareProfile(
        model_name=manifest.name,
        window_length=manifest.window_length,
        arena_bytes=device.tflm_arena_bytes,
        input_scale=device.input_scale,
        output_scale=device.output_scale,
    )


def make_node(
    device: PtySerial,
    kit: ReleaseKit,
    *,
    version: int | None = None,
    public_key: bytes | None = None,
    faults: NodeFaults | None = None,
) -> VirtualNode:
    """A node shipped with the default model (at ``version``) and a full window of history."""
    profile = default_profile()
    image = (DEFAULT_NODE_MODEL / "model_int8.tflite").read_bytes()
    descriptor = ImageDescriptor(
        model_name=profile.model_name,
        model_version=kit.base_version if version is None else version,
        image_size=len(image),
        image_sha256=hashlib.sha256(image).digest(),
        window_length=profile.window_length,
        arena_bytes=profile.arena_bytes,
    )
    return VirtualNode(
        device,
        node_id="node-7",
        public_key=kit.public_key if public_key is None else public_key,
        profile=profile,
        image=image,
        descriptor=descriptor,
        history=np.full(profile.window_length, 15.0),
        faults=faults,
    )


def ota_config(kit: ReleaseKit, broker: Mosquitto, **extra: object) -> OtaConfig:
    return OtaConfig.model_validate(
        {
            "public_key_file": kit.keys.public_path,
            "broker": broker_config(broker),
            "ack_timeout_s": 0.5,
            "commit_timeout_s": 10.0,
            **extra,
        }
    )


@dataclass
class Gateway:
    ota: OtaService
    serial: SerialSource
    readings: asyncio.Queue[Reading]
    reloads: list[int]
    models: ModelSet


@contextlib.asynccontextmanager
async def gateway(
    config: OtaConfig,
    device: PtySerial | None,
    *,
    model_dirs: dict[str, Path] | None = None,
    features: dict[str, str] | None = None,
    gateway_id: str = GATEWAY_ID,
    served: ServedVersions | None = None,
) -> AsyncIterator[Gateway]:
    """The OTA service over a real ModelSet loaded from ``model_dirs`` (as the daemon's)."""
    ports = []
    if device is not None:
        ports.append(
            TypeAdapter(SerialSourceConfig).validate_python(
                {
                    "kind": "node",
                    "port": str(device.path),
                    "reconnect_initial_s": 0.05,
                    "reconnect_max_s": 0.2,
                }
            )
        )
    serial = SerialSource(ports)
    reloads: list[int] = []
    models = ModelSet(model_dirs or {}, features=features, served=served)
    await asyncio.to_thread(models.refresh, force=True)
    service = OtaService(
        config,
        gateway_id=gateway_id,
        broker=broker_config_placeholder(config),
        links=serial.links,
        models=models,
        on_installed=lambda: reloads.append(1),
    )
    queue: asyncio.Queue[Reading] = asyncio.Queue()
    tasks = [
        asyncio.create_task(serial.run(queue, RejectCounter())),
        asyncio.create_task(service.run()),
    ]
    try:
        yield Gateway(ota=service, serial=serial, readings=queue, reloads=reloads, models=models)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def broker_config_placeholder(config: OtaConfig) -> MqttBrokerConfig:
    """The tests always configure the OTA broker explicitly; the fallback is the publisher's."""
    assert config.broker is not None
    return config.broker


def node_states(collector: Collector, node_id: str = "node-7") -> list[str]:
    return [
        json.loads(payload)["status"] for payload in collector.on(f"{STATUS_PREFIX}/node/{node_id}")
    ]


def gateway_states(collector: Collector, gateway_id: str = GATEWAY_ID) -> list[dict[str, object]]:
    topic = f"tesla/{gateway_id}/ota/gateway"
    return [json.loads(payload) for payload in collector.on(topic)]
