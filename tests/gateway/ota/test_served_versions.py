"""The served-version record: a start never serves below what a slot served, a damaged record
never stops the daemon, and a release cannot bring back an old model while the slot is empty.

Real: signed releases of the committed default model, LiteRT, the file system, mosquitto and
the OTA service (the daemon itself: tests/gateway/ota/test_daemon_slots.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import pytest
import structlog

from devkit.broker import Mosquitto
from tesla_gateway.models.served import SERVED_FILENAME, ServedVersions
from tesla_gateway.models.trust import ModelTrust
from tesla_gateway.models.watch import ModelSet
from tesla_gateway.set_aside import SetAsideLog
from tests.gateway.io.helpers import Collector, broker_config, collecting, eventually
from tests.gateway.ota.harness import gateway, gateway_states, ota_config
from tests.support.releases import ReleaseKit
from training.release import push_release


def start(
    kit: ReleaseKit, model_dir: Path, served: ServedVersions, *, allow_downgrade: bool = False
) -> ModelSet:
    """A fresh start of the daemon's models (its trust rule), with the record ``served``."""
    models = ModelSet(
        {"pm10": model_dir},
        trust={"pm10": ModelTrust("auto", kit.public_key)},
        served=served,
        allow_downgrade=allow_downgrade,
    )
    models.refresh(force=True)
    return models


def version(models: ModelSet) -> int | None:
    calibrator = models.get("pm10")
    return None if calibrator is None else calibrator.version


def test_a_start_never_serves_below_the_recorded_version(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    base = release_kit.base_version
    model_dir = tmp_path / "pm10"  # a plain directory holding a signed release, no slots
    shutil.copytree(release_kit.release(base, "gateway"), model_dir)
    record = tmp_path / "state" / SERVED_FILENAME
    assert version(start(release_kit, model_dir, ServedVersions(record))) == base
    document = json.loads(record.read_text())
    assert document == {
        "format": 1,
        "slots": {"pm10": {"model_dir": str(model_dir), "version": base}},
    }

    older = release_kit.release(base - 5, "gateway")
    shutil.copytree(older, model_dir, dirs_exist_ok=True)  # copied over the newer one
    models = start(release_kit, model_dir, ServedVersions(record))
    assert models.missing() == ["pm10"]  # nothing else to serve: degraded, never v-5
    assert f"older than v{base} which slot pm10 has served" in str(
        models.stats()["pm10"]["last_error"]
    )
    assert json.loads(record.read_text()) == document

    models = start(release_kit, model_dir, ServedVersions(record), allow_downgrade=True)
    assert version(models) == base - 5
    assert json.loads(record.read_text())["slots"]["pm10"]["version"] == base - 5


def test_a_damaged_record_is_set_aside_and_the_start_proceeds(
    release_kit: ReleaseKit, tmp_path: Path
) -> None:
    base = release_kit.base_version
    model_dir = tmp_path / "pm10"
    shutil.copytree(release_kit.release(base, "gateway"), model_dir)
    record = tmp_path / "state" / SERVED_FILENAME
    record.parent.mkdir()
    record.write_bytes(b'{"format": 1, "slots": {"pm10": {"model_dir": "/x", "vers')  # torn
    aside = SetAsideLog()
    with structlog.testing.capture_logs() as logs:
        models = start(release_kit, model_dir, ServedVersions(record, set_aside=aside))
    assert version(models) == base  # served as at a first start
    [event] = [e for e in logs if e["event"] == "state_file_set_aside"]
    assert event["kind"] == "served versions" and "not a served-versions record" in event["reason"]
    assert aside.count == 1
    [moved] = record.parent.glob(f"{SERVED_FILENAME}.corrupt-*")
    assert moved.read_bytes().endswith(b'"vers')  # kept for a post-mortem
    assert json.loads(record.read_text())["slots"]["pm10"]["version"] == base  # recorded afresh


def test_the_record_binds_its_directory_and_survives_a_failed_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    served = ServedVersions(state / SERVED_FILENAME)
    assert served.floor("pm10", tmp_path / "a") is None  # read: no record yet, a first start
    state.write_text("")  # a file where the state directory should be: every write fails
    with structlog.testing.capture_logs() as logs:
        served.record("pm10", tmp_path / "a", 7)
    assert [e["event"] for e in logs] == ["served_version_not_saved"]
    assert served.floor("pm10", tmp_path / "a") == 7  # still holds until the restart
    assert served.floor("pm10", tmp_path / "b") is None  # another directory: a new record
    assert served.floor("pm2_5", tmp_path / "a") is None


def answered(collector: Collector, count: int) -> bool:
    return len(gateway_states(collector)) >= count


def test_a_release_cannot_bring_back_an_older_model_while_the_slot_is_empty(
    release_kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Nothing runs (the slot's files rotted), so the release's own downgrade check has nothing
        to compare with: the record refuses an old retained release, the served one repairs, and
    each install is recorded."""
    base = release_kit.base_version
    model_dir = tmp_path / "pm10"
    model_dir.mkdir()
    served = ServedVersions(tmp_path / "state" / SERVED_FILENAME)
    served.record("pm10", model_dir, base)

    async def scenario() -> tuple[list[dict[str, object]], int | None]:
        with collecting(mosquitto, ["tesla/gw1/ota/gateway"]) as collector:
            async with gateway(
                ota_config(release_kit, mosquitto),
                None,
                model_dirs={"pm10": model_dir},
                served=served,
            ) as gw:
                assert gw.models.missing() == ["pm10"]
                for answers, release in enumerate((base - 1, base, base + 1), start=1):
                    await asyncio.to_thread(
                        push_release,
                        release_kit.release(release, "gateway"),
                        broker_config(mosquitto),
                    )
                    await eventually(partial(answered, collector, answers), 10)
                return gateway_states(collector), version(gw.models)

    states, serving = asyncio.run(scenario())
    assert [s["status"] for s in states] == ["rejected: downgrade", "installed", "installed"]
    assert f"older than v{base}, which slot pm10 has served" in str(states[0]["detail"])
    assert serving == base + 1
    record = json.loads((tmp_path / "state" / SERVED_FILENAME).read_text())
    assert record["slots"]["pm10"]["version"] == base + 1  # an installed release is recorded


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to the nobody user")
def test_a_directory_the_daemon_cannot_write_is_its_owners_to_roll_back(
    release_kit: ReleaseKit,
) -> None:
    """As the unprivileged service user: an older model in a root-owned read-only directory
    (a package rolled back) serves; the same in a directory the daemon may write is refused."""
    older = release_kit.release(release_kit.base_version - 5, "gateway")
    with tempfile.TemporaryDirectory(prefix="served-") as scratch:
        root = Path(scratch)
        root.chmod(0o755)  # pytest's own tmp_path is private to root
        read_only, writable = root / "ro", root / "rw"
        for directory in (read_only, writable):
            shutil.copytree(older, directory)
        for path in (writable, *writable.iterdir()):
            shutil.chown(path, "nobody")
        key = root / "release.pub"
        key.write_text(release_kit.public_key.hex(), encoding="ascii")
        floor = release_kit.base_version
        script = (
            "import json, os, pwd, sys\n"
            "from pathlib import Path\n"
            "from tesla_gateway.models.served import ServedVersions\n"
            "from tesla_gateway.models.trust import ModelTrust\n"
            "from tesla_gateway.models.watch import ModelSet\n"
            "key = bytes.fromhex(Path(sys.argv[1]).read_text())\n"
            # Loaded while still root: the venv may live under a directory private to root
            # (a CI clone in a 0700 temporary directory), which nobody cannot read.
            "import ai_edge_litert.interpreter\n"
            "nobody = pwd.getpwnam('nobody')\n"
            "os.setgroups([])\n"
            "os.setgid(nobody.pw_gid)\n"
            "os.setuid(nobody.pw_uid)\n"
            "out = {}\n"
            "for d in sys.argv[3:]:\n"
            "    served = ServedVersions(None)\n"
            "    served.record('pm10', Path(d), int(sys.argv[2]))\n"
            "    models = ModelSet({'pm10': Path(d)}, trust={'pm10': ModelTrust('auto', key)},\n"
            "                      served=served)\n"
            "    models.refresh(force=True)\n"
            "    c = models.get('pm10')\n"
            "    out[d] = c.version if c else models.stats()['pm10']['last_error']\n"
            "print(json.dumps(out))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", script, str(key), str(floor), str(read_only), str(writable)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    verdicts = json.loads(result.stdout.splitlines()[-1])
    assert verdicts[str(read_only)] == release_kit.base_version - 5
    assert f"older than v{floor}" in str(verdicts[str(writable)])
