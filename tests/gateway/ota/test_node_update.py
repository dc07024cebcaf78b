"""End to end on loopback: push -> MQTT -> gateway relay -> pty -> virtual node -> active.

Real: mosquitto, the release tools, the gateway's SerialSource/NodeLink over a pty, the relay,
the TFLite Micro interpreter on the node. Virtual: the Arduino itself (tests/support/
virtual_node.py), since no board exists here.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import serial

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from tesla_gateway.ota.protocol import OtaStatus
from tests.gateway.io.helpers import broker_config, collecting, eventually
from tests.gateway.ota.harness import (
    STATUS_PREFIX,
    gateway,
    gateway_states,
    make_node,
    node_states,
    ota_config,
)
from tests.support.releases import ReleaseKit
from tests.support.virtual_node import NodeFaults, VirtualNode
from training.release import keygen, push_release

MODELS = Path(__file__).resolve().parents[3] / "models"


def _push(release: Path, broker: Mosquitto) -> None:
    push_release(release, broker_config(broker))


def _progress(state: str) -> tuple[int, int]:
    """'transferring 12/114' -> (12, 114); status updates are coalesced, latest wins."""
    done, total = state.removeprefix("transferring ").split("/")
    return int(done), int(total)


def _calibrated_with(node: VirtualNode, version: int) -> list[float]:
    return [
        r.calibrated["cal_pm10"]
        for r in node.readings()
        if r.model_version == version and "cal_pm10" in r.calibrated
    ]


async def _update(  # noqa: PLR0917 - a scenario's five parts and its goal
    kit: ReleaseKit,
    broker: Mosquitto,
    device: PtySerial,
    node: VirtualNode,
    release: Path,
    until: str,
) -> list[str]:
    with collecting(broker, [f"{STATUS_PREFIX}/#"]) as collector:
        async with gateway(ota_config(kit, broker), device) as gw:
            node.start()
            try:
                link = next(iter(gw.serial.links.values()))
                await eventually(lambda: link.hello is not None, 10)
                await asyncio.to_thread(_push, release, broker)
                await eventually(
                    lambda: any(s.startswith(until) for s in node_states(collector)), 30
                )
                await asyncio.sleep(0.2)  # a few readings after the outcome
            finally:
                node.stop()
        assert node.has_working_model()  # whatever happened, the node can still calibrate
        return node_states(collector)


def test_push_updates_a_node_end_to_end(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    new = release_kit.base_version + 1
    node = make_node(pty_serial, release_kit)
    states = asyncio.run(
        _update(release_kit, mosquitto, pty_serial, node, release_kit.release(new), "active")
    )
    assert states[0] == "pending"
    progress = [_progress(state) for state in states if state.startswith("transferring ")]
    total = progress[-1][1]
    assert progress[-1] == (total, total)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert states[-2:] == ["verified", "active"]
    assert node.active_version == new
    values = _calibrated_with(node, new)
    assert values, "the node reported no calibrated value with the new model version"
    assert all(math.isfinite(v) and 0 <= v < 200 for v in values)
    assert OtaStatus.CRC_MISMATCH not in node.status_codes()


def test_a_corrupted_chunk_is_retransmitted(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    new = release_kit.base_version + 2
    node = make_node(pty_serial, release_kit, faults=NodeFaults(corrupt_chunks={3, 50}))
    states = asyncio.run(
        _update(release_kit, mosquitto, pty_serial, node, release_kit.release(new), "active")
    )
    assert node.status_codes().count(OtaStatus.CRC_MISMATCH) == 2
    assert states[-1] == "active"
    assert node.active_version == new


def test_a_cut_link_resumes_where_it_stopped(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    new = release_kit.base_version + 3
    node = make_node(pty_serial, release_kit, faults=NodeFaults(cut_link_after_chunk=40))
    states = asyncio.run(
        _update(release_kit, mosquitto, pty_serial, node, release_kit.release(new), "active")
    )
    assert "link_cut" in node.events
    total = _progress(next(s for s in states if s.startswith("transferring ")))[1]
    assert node.chunks_stored == total  # nothing was sent twice: it resumed at chunk 41
    assert states[-1] == "active"
    assert node.active_version == new


def test_a_second_hello_while_the_update_starts_does_not_shift_the_answers(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    """The update restarts on the second hello; the first handshake's late answer is stale.

    Taken as the answer to the next frame, it shifted every later exchange by one: each chunk
    went twice (``out_of_sequence``) and the stale ``verified`` became the commit's answer, so
    the gateway reported "rejected" while the node activated the new version.
    """
    new = release_kit.base_version + 7
    faults = NodeFaults(hello_during_first_frame=True)
    node = make_node(pty_serial, release_kit, faults=faults)
    states = asyncio.run(
        _update(release_kit, mosquitto, pty_serial, node, release_kit.release(new), "active")
    )
    assert "second_hello" in node.events
    assert states[-2:] == ["verified", "active"], states
    assert not any(s.startswith("rejected") for s in states), states
    assert node.active_version == new
    assert OtaStatus.OUT_OF_SEQUENCE not in node.status_codes()


def test_a_board_that_resets_on_commit_reports_through_its_next_hello(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    new = release_kit.base_version + 6
    node = make_node(pty_serial, release_kit, faults=NodeFaults(usb_reboot=True))
    states = asyncio.run(
        _update(release_kit, mosquitto, pty_serial, node, release_kit.release(new), "active")
    )
    assert states[-2:] == ["verified", "active"]
    assert node.active_version == new


def test_a_node_with_another_key_rejects_the_release_and_keeps_its_model(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial, tmp_path: Path
) -> None:
    other = keygen(tmp_path / "node-key")
    node_key = bytes.fromhex(other.public_path.read_text())
    node = make_node(pty_serial, release_kit, public_key=node_key)
    release = release_kit.release(release_kit.base_version + 4)
    states = asyncio.run(_update(release_kit, mosquitto, pty_serial, node, release, "rejected"))
    assert states[-1].startswith("rejected: descriptor signature does not verify")
    assert node.status_codes() == [OtaStatus.BAD_SIGNATURE]
    assert node.active_version == release_kit.base_version
    assert _calibrated_with(node, release_kit.base_version)


def test_a_node_release_signed_by_an_unknown_key_never_reaches_the_node(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial, tmp_path: Path
) -> None:
    other = keygen(tmp_path / "stranger")
    release = release_kit.release(release_kit.base_version + 8, key=other.private_path)
    node = make_node(pty_serial, release_kit)

    async def scenario() -> list[dict[str, object]]:
        with collecting(mosquitto, [f"{STATUS_PREFIX}/#"]) as collector:
            async with gateway(ota_config(release_kit, mosquitto), pty_serial) as gw:
                node.start()
                try:
                    link = next(iter(gw.serial.links.values()))
                    await eventually(lambda: link.hello is not None, 10)
                    await asyncio.to_thread(_push, release, mosquitto)
                    await eventually(lambda: bool(gateway_states(collector)), 10)
                finally:
                    node.stop()
            return gateway_states(collector)

    states = asyncio.run(scenario())
    assert states[0]["target"] == "node"
    assert states[0]["status"] == "rejected: unknown key"
    assert "configure its public key" in str(states[0]["detail"])
    assert node.status_codes() == []
    assert node.active_version == release_kit.base_version


def test_a_model_that_fails_its_self_test_is_rolled_back(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    # Correctly signed, but the FlatBuffer is the Antwerp model (N = 168): it loads, then
    # fails the node's self-test on the 360-reading window.
    wrong = MODELS / "pm2_5-antwerp-1h" / "model_int8.tflite"
    release = release_kit.release(release_kit.base_version + 5, image=wrong)
    node = make_node(pty_serial, release_kit)
    states = asyncio.run(_update(release_kit, mosquitto, pty_serial, node, release, "rolled back"))
    assert states[-2:] == ["verified", "rolled back"]
    assert "boot_failed:slot1" in node.events
    assert node.active_version == release_kit.base_version
    assert _calibrated_with(node, release_kit.base_version)


def test_no_downgrade_is_offered_to_a_newer_node(
    release_kit: ReleaseKit, mosquitto: Mosquitto, pty_serial: PtySerial
) -> None:
    running = release_kit.base_version + 10
    node = make_node(pty_serial, release_kit, version=running)
    release = release_kit.release(release_kit.base_version + 1)

    async def scenario() -> list[str]:
        with collecting(mosquitto, [f"{STATUS_PREFIX}/#"]) as collector:
            async with gateway(ota_config(release_kit, mosquitto), pty_serial) as gw:
                node.start()
                try:
                    link = next(iter(gw.serial.links.values()))
                    await eventually(lambda: link.hello is not None, 10)
                    await asyncio.to_thread(_push, release, mosquitto)
                    await eventually(lambda: bool(gw.ota.relay._releases), 10)
                    link.hello_handler(link.hello)  # type: ignore[misc,arg-type]
                    await asyncio.sleep(0.5)
                finally:
                    node.stop()
            return node_states(collector)

    assert asyncio.run(scenario()) == []
    assert node.status_codes() == []  # not a single OTA frame reached the node
    assert node.active_version == running


def test_the_node_itself_refuses_a_downgrade(
    release_kit: ReleaseKit, pty_serial: PtySerial
) -> None:
    """Even if a gateway offered it (a stale hello, a buggy relay), the node says no."""
    from tesla_gateway.ota.protocol import Begin, decode_ota, encode_ota
    from tesla_gateway.ota.release import verify_release
    from tesla_gateway.sources.line_protocol import OtaFrame, decode_line

    release = verify_release(
        release_kit.release(release_kit.base_version + 1), release_kit.public_key, None
    )
    node = make_node(pty_serial, release_kit, version=release_kit.base_version + 10)
    node.start()
    port = serial.Serial(str(pty_serial.path), 115200, timeout=5)  # the gateway's end
    try:
        port.readline()  # the boot hello
        port.write(encode_ota(Begin(256, release.descriptor, release.descriptor_signature)))
        answer = [port.readline()]
    finally:
        port.close()
        node.stop()
    frames = [decode_line(line) for line in answer if line.startswith(b"O,")]
    assert isinstance(frames[0], OtaFrame)
    assert decode_ota(frames[0].fields).code == OtaStatus.DOWNGRADE  # type: ignore[union-attr]


@pytest.mark.parametrize("case", ["gateway", "tampered", "downgrade"])
def test_gateway_releases_are_installed_only_when_they_verify(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path, case: str
) -> None:
    import shutil

    from tesla_gateway.contract.manifest import load_manifest
    from tesla_gateway.models.slots import candidates
    from tesla_gateway.ota.release import RELEASE_FILENAME

    serving = tmp_path / "serving"
    shutil.copytree(release_kit.source, serving)
    base = release_kit.base_version
    release = release_kit.release(base + 1 if case != "downgrade" else base - 1, "gateway")
    if case == "tampered":
        release = Path(shutil.copytree(release, tmp_path / "tampered"))
        text = (release / RELEASE_FILENAME).read_text().replace('"pm10"', '"pm1"', 1)
        (release / RELEASE_FILENAME).write_text(text)

    async def scenario() -> tuple[list[dict[str, object]], int]:
        with collecting(mosquitto, [f"{STATUS_PREFIX}/#"]) as collector:
            async with gateway(
                ota_config(release_kit, mosquitto),
                None,
                model_dirs={"pm10": serving},
            ) as gw:
                await asyncio.to_thread(_push, release, mosquitto)
                await eventually(lambda: bool(gateway_states(collector)), 10)
                reloads = len(gw.reloads)
                serving_version = gw.models.get("pm10").version  # type: ignore[union-attr]
            states = gateway_states(collector)
            states.append({"reloads": reloads})
            return states, serving_version

    states, serving_version = asyncio.run(scenario())
    installed = load_manifest(candidates(serving)[0].path).version
    assert serving_version == installed
    if case == "gateway":
        assert states[0]["status"] == "installed"
        assert installed == base + 1
        assert states[-1] == {"reloads": 1}
    else:
        expected = "rejected: bad signature" if case == "tampered" else "rejected: downgrade"
        assert states[0]["status"] == expected
        assert "detail" in states[0]
        assert installed == base
        assert states[-1] == {"reloads": 0}
