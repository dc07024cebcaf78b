"""A refused release is remembered for the topic it came on: one wrong push never poisons the
same release on the right topic, and a redelivery on the wrong one stays quiet.

Real: mosquitto, the release tools, the gateway's OTA service over a real ModelSet and LiteRT.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import structlog

from devkit.broker import Mosquitto
from tesla_gateway.ota.refusals import RefusalMemory
from tesla_gateway.ota.release import RELEASE_FILENAME, encode_bundle, read_release_dir
from tests.gateway.io.helpers import broker_config, collecting, eventually
from tests.gateway.ota.harness import STATUS_PREFIX, gateway, gateway_states, ota_config
from tests.support.releases import ReleaseKit
from tests.support.retained import publish_retained
from training.release import push_release


def _bundle(release: Path) -> bytes:
    """The MQTT payload ``push`` would send for ``release``."""
    _, files = read_release_dir(release)
    return encode_bundle((release / RELEASE_FILENAME).read_bytes(), files)


def test_a_release_refused_on_the_node_topic_still_installs_from_the_gateway_topic(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    serving = tmp_path / "serving"
    shutil.copytree(release_kit.source, serving)
    release = release_kit.release(release_kit.base_version + 1, "gateway")
    wrong_topic = "tesla/releases/node/pm10-ispra-1min"  # an operator's slip: a node topic

    async def scenario() -> tuple[list[dict[str, object]], int | None]:
        with collecting(mosquitto, [f"{STATUS_PREFIX}/#"]) as collector:
            async with gateway(
                ota_config(release_kit, mosquitto), None, model_dirs={"pm10": serving}
            ) as gw:
                payload = _bundle(release)
                await asyncio.to_thread(publish_retained, mosquitto, wrong_topic, payload)
                await eventually(lambda: len(gateway_states(collector)) == 1, 10)
                # The same bytes again on the wrong topic (a redelivery): nothing new to say.
                await asyncio.to_thread(publish_retained, mosquitto, wrong_topic, payload)
                await asyncio.to_thread(push_release, release, broker_config(mosquitto))
                await eventually(lambda: len(gateway_states(collector)) >= 2, 10)
                await asyncio.sleep(0.3)  # room for a late, unwanted answer
                calibrator = gw.models.get("pm10")
                version = None if calibrator is None else calibrator.version
            return gateway_states(collector), version

    with structlog.testing.capture_logs() as logs:
        states, version = asyncio.run(scenario())
    assert [(s["target"], s["status"]) for s in states] == [
        ("node", "rejected: wrong target"),
        ("gateway", "installed"),
    ]
    assert version == release_kit.base_version + 1
    rejected = [e for e in logs if e["event"] == "release_rejected"]
    assert [e["reason"] for e in rejected] == ["wrong target"]  # said once, not per delivery
    assert [e["event"] for e in logs].count("release_already_refused") == 1


def test_the_memory_is_per_target_and_forgets_the_least_recently_seen() -> None:
    memory = RefusalMemory(size=2)
    memory.remember("node", b"a", "wrong target")
    assert memory.recall("node", b"a") == "wrong target"
    assert memory.recall("gateway", b"a") is None  # the other topic judges the bytes afresh
    memory.remember("gateway", b"b", "downgrade")
    assert memory.recall("node", b"a") == "wrong target"  # redelivered: kept
    memory.remember("gateway", b"c", "unloadable")
    assert memory.recall("gateway", b"b") is None  # the least recently seen went first
    assert len(memory) == 2
