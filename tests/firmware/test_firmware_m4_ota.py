"""OTA end to end against the real firmware: push -> MQTT -> gateway relay -> pty -> the node
binary on the emulated Cortex-M4F (qemu mps2-an386).

Real on the node's side: the portable core's OTA receiver and slots, rweather's Ed25519 verify,
the NOR-flash slot region (it survives qemu's system reset, as flash survives a reboot), the
reboot into the trial slot and its self-test under TFLite Micro. The gateway side is the
in-process harness of tests/gateway/ota (real mosquitto, SerialSource, relay).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import time
import tty
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.ota.protocol import OtaStatus
from tesla_gateway.ota.release import key_id, load_public_key
from tests.firmware.qemu_node import (
    FIRMWARE,
    build,
    float_bits,
    missing_prerequisite,
    node_behind_tap,
    node_on_pty,
)
from tests.firmware.serial_tap import LineFaults
from tests.gateway.io.helpers import broker_config, collecting, eventually
from tests.gateway.ota.harness import STATUS_PREFIX, gateway, node_states, ota_config
from tests.support.releases import ReleaseKit
from tests.support.retained import publish_retained
from training.release import KeyPair

NODE_ID = "node-m4"  # firmware/m4/node_main.cpp kNodeId
MODEL = "pm10-ispra-1min"
MODELS = FIRMWARE.parent / "models"

_missing = missing_prerequisite()
pytestmark = [
    pytest.mark.skipif(_missing is not None, reason=str(_missing)),
    pytest.mark.timeout(1800),  # the first build compiles TFLite Micro
]


@dataclass
class NodePort:
    """What the harness needs of a serial device: the path the gateway opens."""

    path: Path


@pytest.fixture(scope="module")
def firmware() -> Path:
    return build(MODEL)


@pytest.fixture
def kit(tmp_path: Path, firmware: Path) -> ReleaseKit:
    """Releases signed with the key the firmware was built to trust (firmware/build/m4/keys)."""
    return _with_firmware_key(ReleaseKit(tmp_path / "releases"))


def _with_firmware_key(kit: ReleaseKit) -> ReleaseKit:
    keys = FIRMWARE / "build" / "m4" / "keys"
    public = keys / "release_key.pub"
    kit.keys = KeyPair(keys / "release_key.ed25519", public, key_id(load_public_key(public)))
    return kit


def _settled(states: list[str]) -> bool:
    return any(s == "active" or s.startswith(("rolled back", "rejected")) for s in states)


async def _update(
    kit: ReleaseKit, broker: Mosquitto, port: NodePort | PtySerial, release: Path, running: int
) -> list[str]:
    """The node's states until the outcome, then its hello once it names ``running``."""
    from training.release import push_release

    with collecting(broker, [f"{STATUS_PREFIX}/#"]) as collector:
        # The harness's 0.5 s acknowledgement timeout is for the in-process virtual node; the
        # emulated UART takes longer per chunk (a late answer to an earlier frame is dropped
        # by the relay, tests/gateway/ota/test_node_update.py's second-hello test).
        config = ota_config(kit, broker, ack_timeout_s=5.0, commit_timeout_s=30.0)
        async with gateway(config, port) as gw:  # type: ignore[arg-type]
            link = next(iter(gw.serial.links.values()))
            await eventually(lambda: link.hello is not None, 30)
            await asyncio.to_thread(push_release, release, broker_config(broker))
            await eventually(lambda: _settled(node_states(collector, NODE_ID)), 120)
            # "active" comes with the commit's answer; the hello from the trial boot follows.
            with contextlib.suppress(TimeoutError):  # the caller's assertions tell what came
                await eventually(lambda: getattr(link.hello, "model_version", None) == running, 30)
            hello = link.hello
        return [*node_states(collector, NODE_ID), f"hello:{hello}"]


def test_push_updates_the_emulated_node_end_to_end(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    new = kit.base_version + 1
    port = NodePort(tmp_path / "ttyNODE0")
    with node_on_pty(firmware, port.path):
        states = asyncio.run(_update(kit, mosquitto, port, kit.release(new), new))
    assert "verified" in states, states
    assert states[-2] == "active", states
    assert str(new) in states[-1], states  # the hello after the trial boot names the new version


def test_the_emulated_node_rejects_a_release_signed_with_another_key(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    """The gateway trusts the other key too here; the node's own Ed25519 check must refuse."""
    from training.release import keygen

    other = keygen(tmp_path / "other-key")
    new = kit.base_version + 2
    release = kit.release(new, key=other.private_path)
    kit.keys = other  # the gateway accepts and relays it; only the node knows better
    port = NodePort(tmp_path / "ttyNODE0")
    with node_on_pty(firmware, port.path):
        states = asyncio.run(_update(kit, mosquitto, port, release, kit.base_version))
    assert states[-2].startswith("rejected"), states
    assert "signature" in states[-2], states
    assert str(kit.base_version) in states[-1] and str(new) not in states[-1], states


def test_a_corrupted_chunk_and_a_cut_link_still_end_active_on_the_emulated_node(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    """Chunk 3 reaches the node damaged (its CRCs as sent): the node answers crc_mismatch and
    gets it again. After chunk 40 the cable is pulled for a second: the gateway reopens the
    port, repeats the handshake and the node, which kept its session, resumes at chunk 41."""
    new = kit.base_version + 3
    device = PtySerial(tmp_path / "ttyNODE0")
    faults = LineFaults(corrupt_chunk=3, cut_after_chunk=40)
    try:
        with node_behind_tap(firmware, device, faults) as line:
            states = asyncio.run(_update(kit, mosquitto, device, kit.release(new), new))
    finally:
        device.close()
    assert line.events == ["corrupted chunk 3", "link cut after chunk 40"], line.events
    codes = [s.code for s in line.statuses]
    assert codes.count(OtaStatus.CRC_MISMATCH) == 1, codes
    assert line.chunks_sent.count(3) == 2, line.chunks_sent
    # Resumed, not restarted: no chunk below 41 went again after the cut.
    assert all(line.chunks_sent.count(seq) == 1 for seq in range(4, 41)), line.chunks_sent
    assert 41 in line.chunks_sent
    assert states[-2:-1] == ["active"], states
    assert str(new) in states[-1], states


def test_a_release_that_fails_the_self_test_is_rolled_back_on_the_emulated_node(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    """Correctly signed, but the FlatBuffer is the Antwerp model (N = 168): it verifies, the
    node reboots into it, its self-test on the 360-reading window fails, and the node boots
    the old slot again and says so."""
    wrong = MODELS / "pm2_5-antwerp-1h" / "model_int8.tflite"
    release = kit.release(kit.base_version + 5, image=wrong)
    port = NodePort(tmp_path / "ttyNODE0")
    with node_on_pty(firmware, port.path):
        states = asyncio.run(_update(kit, mosquitto, port, release, kit.base_version))
    assert "verified" in states, states
    assert states[-2] == "rolled back", states
    assert str(kit.base_version) in states[-1] and str(kit.base_version + 5) not in states[-1]


def test_a_covariate_node_rolls_back_a_pm_only_graph_at_its_self_test(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """A node built for the covariate model (input [1, 360, 3]) gets a release of its own name
    whose FlatBuffer is the PM-only graph ([1, 360]): it fits the slot and verifies, and the
    self-test refuses it on the input's shape; the covariate model boots again."""
    covariate = MODELS / "pm10-ispra-1min-rh-temp"
    elf = build(covariate.name)
    kit = _with_firmware_key(ReleaseKit(tmp_path / "releases", model_dir=covariate))
    release = kit.release(kit.base_version + 1, image=MODELS / MODEL / "model_int8.tflite")
    port = NodePort(tmp_path / "ttyNODE0")
    with node_on_pty(elf, port.path):
        states = asyncio.run(_update(kit, mosquitto, port, release, kit.base_version))
    assert "verified" in states, states
    assert states[-2] == "rolled back", states
    assert str(kit.base_version) in states[-1] and str(kit.base_version + 1) not in states[-1]


def test_the_emulated_node_refuses_an_image_larger_than_its_slot(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    """The slot holds the default model + 10 % (firmware/src/model_constants.h kSlotBytes)."""
    model = MODELS / MODEL / "model_int8.tflite"
    padded = tmp_path / "padded" / "model_int8.tflite"
    padded.parent.mkdir()
    padded.write_bytes(model.read_bytes().ljust(40 * 1024, b"\0"))
    release = kit.release(kit.base_version + 9, image=padded)
    port = NodePort(tmp_path / "ttyNODE0")
    with node_on_pty(firmware, port.path):
        states = asyncio.run(_update(kit, mosquitto, port, release, kit.base_version))
    assert (
        states[-2] == "rejected: image larger than the node's model slot; shrink the model "
        "or repartition the flash"
    ), states
    assert "verified" not in states and not any(s.startswith("transferring") for s in states)


def _young_window_calibrated(device: Path, periods: int) -> bool:
    """Whether the node calibrates its own window after ``periods`` periods of readings (its
    answer to ``#W``: ``#W,<history>,-`` when it does not), asked over the pty the gateway
    closed. Every update reboots the node, so each call starts from an empty window."""
    fd = os.open(device, os.O_RDWR | os.O_NOCTTY)
    try:
        tty.setraw(fd)
        lines = [f"#A,{1000 + p},{float_bits(20.0)}\n" for p in range(periods)] + ["#W\n"]
        os.write(fd, "".join(lines).encode("ascii"))
        seen = b""
        deadline = time.monotonic() + 30
        while (answer := re.search(rb"(?m)^#W,([^\r\n]*)\r?\n", seen)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no #W answer from the emulated node: {seen[-200:]!r}")
            if select.select([fd], [], [], 1.0)[0]:
                seen += os.read(fd, 4096)
    finally:
        os.close(fd)
    history, result = answer.group(1).decode("ascii").split(",")[:2]
    assert int(history) == periods, answer.group(0)
    return result != "-"


def test_the_emulated_node_calibrates_young_windows_only_as_the_installed_model_allows(
    kit: ReleaseKit, mosquitto: Mosquitto, firmware: Path, tmp_path: Path
) -> None:
    """The factory model calibrates from 1 period (its kMinHistoryPeriods). An OTA model trained
    for whole windows (descriptor: min_history N) must not calibrate a 3-period window; the next
    one, from 1 period, does; a later release that fails its self-test is rolled back and the
    rule of the model that serves again (1) applies, not the failed one's (N)."""
    whole = {"min_history_periods": None}  # the manifest's "whole windows only": N on the node
    young = {"min_history_periods": 1}
    wrong = MODELS / "pm2_5-antwerp-1h" / "model_int8.tflite"  # fails the self-test
    port = NodePort(tmp_path / "ttyNODE0")
    v = kit.base_version
    steps = [
        (kit.release(v + 11, manifest_update=whole), v + 11, "active", False),
        (kit.release(v + 12, manifest_update=young), v + 12, "active", True),
        (kit.release(v + 13, image=wrong, manifest_update=whole), v + 12, "rolled back", True),
    ]
    with node_on_pty(firmware, port.path):
        assert _young_window_calibrated(port.path, 3)  # the factory model's own rule
        for release, serving, outcome, calibrated in steps:
            # Cleared, else the last update's retained outcome settles it.
            publish_retained(mosquitto, f"{STATUS_PREFIX}/node/{NODE_ID}", b"")
            states = asyncio.run(_update(kit, mosquitto, port, release, serving))
            assert states[-2] == outcome, states
            assert f"{serving}" in states[-1], states
            assert _young_window_calibrated(port.path, 3) is calibrated, (release.name, states)
