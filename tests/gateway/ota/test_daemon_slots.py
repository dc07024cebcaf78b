"""The real daemon and mosquitto: a signed release that cannot load never bricks a gateway, a
gateway with no loadable model starts degraded and a release repairs it, and a staged rollout
installs only where it is meant to.

Real: ``python -m tesla_gateway run``, mosquitto, ``tesla-train``'s release and push code, LiteRT,
the sd_notify socket protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from functools import partial
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import load_manifest, write_manifest
from tesla_gateway.daemon.cli import main
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import Rollout, Target, verify_release
from tests.gateway.core.test_service import Daemon, NotifySocket, daemons, wait_for
from tests.gateway.io.helpers import Collector, broker_config, collecting, eventually
from tests.gateway.ota.harness import gateway, gateway_states, ota_config
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit
from training.release import build_release, push_release

__all__ = ["daemons"]  # the fixture, re-exported for pytest

GATEWAY_ID = "gw-slots"
OTHER_GRAPH = DEFAULT_NODE_MODEL.parent / "pm2_5-antwerp-1h"  # N = 168 under an N = 360 manifest


def write_config(
    tmp_path: Path,
    broker: Mosquitto,
    model_dir: Path,
    key: Path,
    *,
    allow_downgrade: bool = False,
) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
gateway_id = "{GATEWAY_ID}"
state_dir = "{tmp_path / "state"}"
[[models]]
feature = "pm10"
model_dir = "{model_dir}"
[runtime]
model_poll_s = 600
[state]
status_interval_s = 0.1
[logging]
format = "json"
[publisher.broker]
port = {broker.port}
[ota]
public_key_file = "{key}"
allow_downgrade = {str(allow_downgrade).lower()}
""",
        encoding="utf-8",
    )
    return path


def statuses(collector: Collector) -> list[str]:
    return [str(s["status"]) for s in gateway_states(collector, GATEWAY_ID)]


def serving_version(daemon: Daemon) -> object:
    return daemon.status().get("models", {}).get("pm10", {}).get("version")


def test_a_release_that_cannot_load_is_rejected_and_every_restart_still_serves(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path, daemons: list[Daemon]
) -> None:
    base = release_kit.base_version
    model_dir = tmp_path / "pm10"
    initial = release_kit.release(base, "gateway")
    install_release(verify_release(initial, release_kit.public_key, None), model_dir, "pm10")
    config = write_config(tmp_path, mosquitto, model_dir, release_kit.keys.public_path)
    state = tmp_path / "state"
    bad = release_kit.mismatched(base + 1, OTHER_GRAPH)
    with collecting(mosquitto, [f"tesla/{GATEWAY_ID}/ota/gateway"]) as collector:
        daemons.append(Daemon(config, state))
        push_release(bad, broker_config(mosquitto))
        wait_for(lambda: statuses(collector), "the gateway's answer to the release")
        [answer] = gateway_states(collector, GATEWAY_ID)
        assert answer["status"] == "rejected: unloadable"
        assert "168" in str(answer["detail"])
        assert serving_version(daemons[-1]) == base  # the old model keeps serving
        assert daemons[-1].status()["degraded"] == []
        assert daemons[-1].stop() == 0

        # The next start serves the old model; the retained release is refused again.
        daemons.append(Daemon(config, state))
        wait_for(lambda: len(statuses(collector)) == 2, "the redelivered release's answer")
        assert statuses(collector) == ["rejected: unloadable"] * 2
        assert serving_version(daemons[-1]) == base

        # A good, newer release then installs as usual.
        push_release(release_kit.release(base + 2, "gateway"), broker_config(mosquitto))
        wait_for(lambda: serving_version(daemons[-1]) == base + 2, "the good release to serve")
        # "installed" is published once the new model serves: it may arrive a moment later.
        wait_for(lambda: statuses(collector)[-1:] == ["installed"], "the 'installed' answer")
        assert daemons[-1].stop() == 0


def stop_settled(daemon: Daemon) -> int | None:
    """Stop once the publisher's connection is up: a SIGTERM while the daemon's MQTT sessions
    are still connecting sometimes hangs its shutdown (seen at every commit since c868917: 1 to
    5 of 10 starts stopped at once); this test is about models, not that."""
    daemon.wait_status(lambda status: bool(status.get("publisher", {}).get("connected")))
    return daemon.stop()


def pm10(daemon: Daemon) -> dict[str, object]:
    entry = daemon.status().get("models", {}).get("pm10", {})
    return entry if isinstance(entry, dict) else {}


def test_an_older_signed_release_copied_in_is_never_served_without_allow_downgrade(
    release_kit: ReleaseKit,
    mosquitto: Mosquitto,
    tmp_path: Path,
    daemons: list[Daemon],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused on reload, and by every later start too (the served version is recorded in
    the state directory); the operator's allow_downgrade serves it, and that rollback sticks."""
    base = release_kit.base_version
    key = release_kit.keys.public_path
    model_dir = tmp_path / "pm10"
    state = tmp_path / "state"
    install_release(
        verify_release(release_kit.release(base, "gateway"), release_kit.public_key, None),
        model_dir,
        "pm10",
    )
    config = write_config(tmp_path, mosquitto, model_dir, key)
    daemons.append(Daemon(config, state))
    assert serving_version(daemons[-1]) == base
    record = json.loads((state / "served-versions.json").read_text())
    assert record["slots"]["pm10"] == {"model_dir": str(model_dir), "version": base}

    # An older, validly signed release put into the model directory by hand (the installer
    # makes it current; the serving one becomes previous), then SIGHUP: refused.
    older = release_kit.release(base - 5, "gateway")
    install_release(verify_release(older, release_kit.public_key, None), model_dir, "pm10")
    os.kill(daemons[-1].pid, signal.SIGHUP)
    status = daemons[-1].wait_status(lambda s: s["models"]["pm10"]["rejected"] >= 1)
    assert "older than the serving version" in str(status["models"]["pm10"]["last_error"])
    assert serving_version(daemons[-1]) == base
    assert stop_settled(daemons[-1]) == 0

    # A restart has nothing serving to compare with, but the record: still refused.
    daemons.append(Daemon(config, state))
    assert serving_version(daemons[-1]) == base
    assert pm10(daemons[-1])["slot"] == "previous"
    assert f"older than v{base} which slot pm10 has served" in str(pm10(daemons[-1])["fallback"])
    assert stop_settled(daemons[-1]) == 0
    assert main(["check-config", "--config", str(config)]) == 0  # says what the daemon does
    out = capsys.readouterr().out
    assert f"v{base} " in out and "FALLBACK to previous" in out

    # The operator allows the downgrade: the older model serves, and keeps serving after the
    # permission is withdrawn (the record follows a deliberate rollback).
    config = write_config(tmp_path, mosquitto, model_dir, key, allow_downgrade=True)
    daemons.append(Daemon(config, state))
    assert serving_version(daemons[-1]) == base - 5
    assert pm10(daemons[-1])["slot"] == "current"
    assert stop_settled(daemons[-1]) == 0
    config = write_config(tmp_path, mosquitto, model_dir, key)
    daemons.append(Daemon(config, state))
    assert serving_version(daemons[-1]) == base - 5
    assert stop_settled(daemons[-1]) == 0


def test_no_loadable_model_starts_degraded_and_a_release_repairs_it(
    release_kit: ReleaseKit,
    mosquitto: Mosquitto,
    tmp_path: Path,
    daemons: list[Daemon],
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir = tmp_path / "pm10"  # nothing there yet: a fresh OTA-managed gateway
    config = write_config(tmp_path, mosquitto, model_dir, release_kit.keys.public_path)
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        with collecting(mosquitto, [f"tesla/{GATEWAY_ID}/ota/gateway"]) as collector:
            daemons.append(
                Daemon(config, tmp_path / "state", env={"NOTIFY_SOCKET": str(notify.path)})
            )
            daemon = daemons[-1]
            status = daemon.status()
            assert status["degraded"] == ["pm10"]
            assert status["models"]["pm10"]["version"] is None
            assert "pm10" in status["models"]["pm10"]["last_error"]
            assert main(["status", "--config", str(config)]) == 0
            assert "DEGRADED: no model serves" in capsys.readouterr().out
            wait_for(lambda: notify.datagrams, "READY")
            assert notify.datagrams[0].startswith(
                "READY=1\nSTATUS=running, degraded (no model: pm10):"
            )

            version = release_kit.base_version
            push_release(release_kit.release(version, "gateway"), broker_config(mosquitto))
            wait_for(lambda: serving_version(daemon) == version, "the release to repair it")
            assert daemon.status()["degraded"] == []
            # "installed" is published once the new model serves: it may arrive a moment later.
            wait_for(lambda: statuses(collector) == ["installed"], "the 'installed' answer")
            wait_for(
                lambda: any(d.startswith("STATUS=running: ") for d in notify.datagrams),
                "a status line without 'degraded'",
            )
            assert daemon.stop() == 0
    finally:
        notify.close()


def answered(collector: Collector, before: int) -> bool:
    return len(gateway_states(collector, "gw-hall")) > before


def _rollout_release(
    kit: ReleaseKit, version: int, rollout: Rollout, target: Target = "gateway"
) -> Path:
    names = "-".join(rollout.gateways + rollout.groups)
    out = kit.root / f"release-{target}-v{version}-rollout-{names}"
    if not out.exists():
        build_release(kit.model_at(version), target, kit.keys.private_path, out, rollout=rollout)
    return out


def test_a_staged_rollout_is_ignored_by_other_gateways_and_installed_by_its_group(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    serving = tmp_path / "serving"
    shutil.copytree(DEFAULT_NODE_MODEL, serving)
    base = release_kit.base_version
    for_other = _rollout_release(release_kit, base + 1, Rollout(gateways=["gw-kitchen"]))
    for_canary = _rollout_release(release_kit, base + 2, Rollout(groups=["canary"]))
    node_for_other = _rollout_release(
        release_kit, base + 3, Rollout(gateways=["gw-kitchen"]), target="node"
    )

    async def scenario() -> tuple[list[dict[str, object]], list[int | None]]:
        versions: list[int | None] = []
        with collecting(mosquitto, ["tesla/gw-hall/ota/gateway"]) as collector:
            config = ota_config(release_kit, mosquitto, groups=["canary"])
            async with gateway(
                config, None, model_dirs={"pm10": serving}, gateway_id="gw-hall"
            ) as gw:
                for release in (for_other, for_canary, node_for_other):
                    count = len(gateway_states(collector, "gw-hall"))
                    await asyncio.to_thread(push_release, release, broker_config(mosquitto))
                    await eventually(partial(answered, collector, count), 10)
                    calibrator = gw.models.get("pm10")
                    versions.append(None if calibrator is None else calibrator.version)
            return gateway_states(collector, "gw-hall"), versions

    states, versions = asyncio.run(scenario())
    assert [(s["target"], s["status"]) for s in states] == [
        ("gateway", "ignored: not in rollout"),
        ("gateway", "installed"),
        ("node", "ignored: not in rollout"),  # not relayed to this gateway's nodes either
    ]
    assert "gw-kitchen" in str(states[0]["detail"]) and "canary" in str(states[0]["detail"])
    assert versions == [base, base + 2, base + 2]


def _covariate_release(kit: ReleaseKit, version: int) -> Path:
    """The committed covariate pm10 model as a signed gateway release announcing ``version``."""
    source = DEFAULT_NODE_MODEL.parent / "pm10-ispra-1min-rh-temp"
    model = kit.root / f"covariate-v{version}"
    out = kit.root / f"release-covariate-v{version}"
    if not out.exists():
        shutil.copytree(source, model, dirs_exist_ok=True)
        write_manifest(model, load_manifest(model).model_copy(update={"version": version}))
        build_release(model, "gateway", kit.keys.private_path, out)
    return out


def test_a_release_goes_to_the_model_slot_of_its_channels(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Two pm10 models (PM only; PM, rh, temp_c): each release replaces the one whose input
    channels it has, never the other; a feature this gateway does not serve is rejected."""
    plain, covariate = tmp_path / "pm10", tmp_path / "pm10-rh-temp"
    shutil.copytree(DEFAULT_NODE_MODEL, plain)
    shutil.copytree(DEFAULT_NODE_MODEL.parent / "pm10-ispra-1min-rh-temp", covariate)
    plain_version = load_manifest(plain).version
    covariate_version = load_manifest(covariate).version
    releases = [
        _covariate_release(release_kit, covariate_version + 1),
        release_kit.release(release_kit.base_version + 1, "gateway"),
    ]

    async def scenario() -> tuple[list[dict[str, object]], list[tuple[int | None, ...]]]:
        served: list[tuple[int | None, ...]] = []
        with collecting(mosquitto, ["tesla/gw-hall/ota/gateway"]) as collector:
            async with gateway(
                ota_config(release_kit, mosquitto),
                None,
                model_dirs={"pm10": plain, "pm10-rh-temp": covariate},
                features={"pm10": "pm10", "pm10-rh-temp": "pm10"},
                gateway_id="gw-hall",
            ) as gw:
                for release in releases:
                    count = len(gateway_states(collector, "gw-hall"))
                    await asyncio.to_thread(push_release, release, broker_config(mosquitto))
                    await eventually(partial(answered, collector, count), 10)
                    served.append(
                        tuple(
                            None if (c := gw.models.get(slot)) is None else c.version
                            for slot in ("pm10", "pm10-rh-temp")
                        )
                    )
            return gateway_states(collector, "gw-hall"), served

    states, served = asyncio.run(scenario())
    assert [s["status"] for s in states] == ["installed", "installed"]
    assert served == [
        (plain_version, covariate_version + 1),  # the covariate release: its own slot only
        (release_kit.base_version + 1, covariate_version + 1),
    ]
    assert (covariate / "current" / "manifest.json").is_file()
    assert load_manifest(covariate / "current").channel_names == ("pm10", "rh", "temp_c")
