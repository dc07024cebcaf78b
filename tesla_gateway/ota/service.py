"""The gateway's OTA task: receive signed releases on MQTT, install or relay them, report status.

Releases arrive retained on ``<releases_topic_prefix>/gateway/<model>`` (staged in a new slot of
the model directory serving that feature, checked by the real Calibrator and its golden windows,
switched to atomically and served: tesla_gateway/ota/install.py) and ``.../node/<model>`` (handed to
the :class:`NodeRelay`). Each is verified against the configured public key first; a release
whose signed rollout does not name this gateway (or one of its ``groups``) is ignored; a
rejection is published with its reason on ``<status_prefix>/gateway`` or per node on
``<status_prefix>/node/<node_id>`` (retained JSON, latest state wins). ``installed`` is published
only once the new model serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.connection import MqttConnection
from tesla_gateway.mqtt.errors import MqttError
from tesla_gateway.mqtt.inbox import InboundMessage
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.ota.errors import (
    DowngradeError,
    IncompatibleReleaseError,
    OtaError,
    ReleaseRejectedError,
)
from tesla_gateway.ota.install import InstalledRelease, install_release
from tesla_gateway.ota.refusals import RefusalMemory
from tesla_gateway.ota.relay import NodeRelay, NodeUpdateStatus
from tesla_gateway.ota.release import (
    VerifiedRelease,
    decode_bundle,
    load_public_key,
    verify_release,
)
from tesla_gateway.sources.serial_source import NodeLink

if TYPE_CHECKING:
    from tesla_gateway.models.calibrator import Calibrator

__all__ = ["OtaService", "ServingModels"]

_log = structlog.get_logger(__name__)
_MAX_QUEUED_STATUS = 1000


class ServingModels(Protocol):
    """What the OTA service needs of the gateway's models (tesla_gateway.models.watch.ModelSet)."""

    @property
    def features(self) -> tuple[str, ...]: ...

    def feature_of(self, slot_id: str) -> str: ...

    def release_slot(self, feature: str, channels: Sequence[str]) -> str | None: ...

    def model_dir(self, slot_id: str) -> Path | None: ...

    def get(self, slot_id: str) -> Calibrator | None: ...

    def downgrade_floor(self, slot_id: str) -> int | None: ...

    def load_candidate(self, slot_id: str, directory: Path) -> Calibrator: ...

    def adopt(self, slot_id: str, calibrator: Calibrator) -> bool: ...


class OtaService:
    """One MQTT connection for releases and status, plus the node relay."""

    def __init__(
        self,
        config: OtaConfig,
        *,
        gateway_id: str,
        broker: MqttBrokerConfig,
        links: Mapping[str, NodeLink],
        models: ServingModels,
        on_installed: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._gateway_id = gateway_id
        self._broker = config.broker or broker
        self._public_key = load_public_key(config.public_key_file)  # fail at start, not later
        self._models = models
        self._on_installed = on_installed
        # Releases refused per target topic: a retained one redelivered at every reconnect is
        # not staged, loaded and reported again (tesla_gateway/ota/refusals.py).
        self._refused = RefusalMemory()
        self._clock = clock
        self.status_prefix = config.status_topic_prefix or f"tesla/{gateway_id}/ota"
        # Every step in order (a node's "active" must not be overwritten by what follows it);
        # progress is already throttled by the relay, and the bound caps a long broker outage.
        self._outgoing: deque[tuple[str, bytes]] = deque(maxlen=_MAX_QUEUED_STATUS)
        self._dirty = asyncio.Event()
        self.relay = NodeRelay(
            links if config.relay_to_nodes else {}, config, on_status=self._node_status
        )

    # -- status ----------------------------------------------------------------------------

    def _queue_status(self, topic: str, document: dict[str, object]) -> None:
        document = {**document, "gateway_id": self._gateway_id, "updated_at": self._clock()}
        self._outgoing.append((topic, json.dumps(document, sort_keys=True).encode("utf-8")))
        self._dirty.set()

    def _node_status(self, status: NodeUpdateStatus) -> None:
        self._queue_status(f"{self.status_prefix}/node/{status.node_id}", status.as_dict())

    def _gateway_status(
        self, target: str, model: object, version: object, status: str, detail: str
    ) -> None:
        """What this gateway did with a release it received (its own, or one to relay)."""
        self._queue_status(
            f"{self.status_prefix}/gateway",
            {
                "target": target,
                "model": model,
                "version": version,
                "status": status,
                "detail": detail,
            },
        )

    async def _status_loop(self, connection: MqttConnection) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            while self._outgoing:
                await connection.wait_connected()
                topic, payload = self._outgoing[0]
                try:
                    await connection.publish(topic, payload, qos=1, retain=True)
                except MqttError as exc:
                    _log.warning("ota_status_publish_failed", topic=topic, error=str(exc))
                    await asyncio.sleep(self._broker.reconnect_initial_s)
                    continue  # the same message again, once reconnected
                if self._outgoing and self._outgoing[0] == (topic, payload):
                    self._outgoing.popleft()

    # -- releases --------------------------------------------------------------------------

    async def _on_message(self, message: InboundMessage) -> None:
        if not message.payload:  # a cleared retained release
            return
        target = message.topic[len(self._config.releases_topic_prefix) + 1 :].split("/")[0]
        digest = hashlib.sha256(message.payload).digest()
        reason = self._refused.recall(target, digest)
        if reason is not None:
            _log.debug("release_already_refused", topic=message.topic, reason=reason)
            return
        try:
            if target == "gateway":
                await self._accept_gateway_release(message.payload)
            elif target == "node":
                release = verify_release(message.payload, self._public_key, None, target="node")
                if self._in_rollout(release):
                    self.relay.offer(release)
        except ReleaseRejectedError as exc:
            self._refused.remember(target, digest, exc.reason)
            model, version = _claimed(message.payload)
            _log.warning(
                "release_rejected",
                topic=message.topic,
                reason=exc.reason,
                model=model,
                version=version,
                error=str(exc),
            )
            self._gateway_status(target, model, version, f"rejected: {exc.reason}", str(exc))
        except OtaError as exc:
            model, version = _claimed(message.payload)
            _log.error("release_install_failed", topic=message.topic, error=str(exc))
            self._gateway_status(target, model, version, "failed", str(exc))

    def _in_rollout(self, release: VerifiedRelease) -> bool:
        """True if the signed rollout names this gateway; else log and report it, not an error."""
        if release.is_for(self._gateway_id, self._config.groups):
            return True
        rollout = release.metadata.rollout
        detail = (
            f"the release is for {rollout.describe() if rollout else 'every gateway'}; this is "
            f"{self._gateway_id} in groups {sorted(self._config.groups)}"
        )
        _log.info(
            "release_not_for_this_gateway",
            model=release.metadata.model,
            version=release.version,
            target=release.target,
            detail=detail,
        )
        self._gateway_status(
            release.target,
            release.metadata.model,
            release.version,
            "ignored: not in rollout",
            detail,
        )
        return False

    async def _accept_gateway_release(self, payload: bytes) -> None:
        # Authenticity first: nothing the release claims (its feature) is believed before.
        authentic = verify_release(payload, self._public_key, None, target="gateway")
        if not self._in_rollout(authentic):
            return
        feature = authentic.manifest.feature
        channels = authentic.manifest.channel_names
        slot = self._models.release_slot(feature, channels)
        model_dir = None if slot is None else self._models.model_dir(slot)
        if slot is None or model_dir is None:
            served = sorted(self._models.features)
            raise IncompatibleReleaseError(
                f"release for {feature} (channels {', '.join(channels)}), this gateway serves "
                f"{served}"
                + (
                    " with no model slot of those channels"
                    if feature in served
                    else "; add a [[models]] entry for it or publish it to the right gateways"
                )
            )
        serving = self._models.get(slot)
        running = None if serving is None else serving.version
        if authentic.version == running:  # our own retained release, redelivered
            _log.debug("release_already_running", feature=feature, version=running)
            return
        release = verify_release(  # the one downgrade rule, now with the running version
            payload, self._public_key, running, self._config.allow_downgrade, target="gateway"
        )
        floor = self._models.downgrade_floor(slot)
        if floor is not None and release.version < floor:  # e.g. degraded, nothing running
            raise DowngradeError(
                f"release {release.metadata.model} v{release.version} is older than v{floor}, "
                f"which slot {slot} has served; publish a higher version or allow the "
                "downgrade explicitly"
            )
        installed = await asyncio.to_thread(self._install, release, model_dir, slot)
        self._on_installed()  # windows for the new model, before its first tick
        _log.info(
            "release_installed",
            model=release.metadata.model,
            version=release.version,
            slot=str(installed.slot),
            golden_deviation=installed.golden_deviation,
            previous_version=running,
        )
        self._gateway_status(
            "gateway", release.metadata.model, release.version, "installed", str(installed.slot)
        )

    def _install(self, release: VerifiedRelease, model_dir: Path, slot: str) -> InstalledRelease:
        """Stage, check, switch (blocking; in a worker thread), then serve the new model."""
        serving = self._models.get(slot)
        installed = install_release(
            release,
            model_dir,
            self._models.feature_of(slot),
            load=lambda staged: self._models.load_candidate(slot, staged),
            keep=None if serving is None else serving.model_dir,
        )
        self._models.adopt(slot, installed.calibrator)
        return installed

    # -- run -------------------------------------------------------------------------------

    async def run(self) -> None:
        prefix = self._config.releases_topic_prefix
        async with MqttConnection(
            self._broker,
            client_id=f"tesla-gateway-{self._gateway_id}-ota"[:64],
            clean_start=True,
            on_message=self._on_message,
            name="ota",
        ) as connection:
            await connection.subscribe([f"{prefix}/gateway/+", f"{prefix}/node/+"])
            async with asyncio.TaskGroup() as group:
                group.create_task(connection.serve(), name="ota-mqtt")
                group.create_task(self._status_loop(connection), name="ota-status")
                group.create_task(self.relay.run(), name="ota-relay")


def _claimed(payload: bytes) -> tuple[object, object]:
    """Model and version a (possibly bogus) release claims, for the rejection report."""
    try:
        document, _ = decode_bundle(payload)
    except OtaError:
        return None, None
    return document.get("model"), document.get("version")
