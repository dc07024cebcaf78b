"""Model slots: a release becomes current only once the real Calibrator served it, atomically.

Real: signed releases of the committed default model, LiteRT, the file system, SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import structlog

from devkit.broker import Mosquitto
from tesla_gateway.daemon.cli import main
from tesla_gateway.models.slots import (
    CURRENT,
    PREVIOUS,
    SLOTS,
    Candidate,
    ModelSlots,
    candidates,
)
from tesla_gateway.models.trust import ModelTrust
from tesla_gateway.models.watch import ModelSet, ReloadOutcome
from tesla_gateway.ota.errors import GoldenMismatchError, UnloadableReleaseError
from tesla_gateway.ota.golden import GOLDEN_FILENAME
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release
from tests.gateway.io.helpers import broker_config, collecting, eventually
from tests.gateway.ota.harness import gateway, gateway_states, ota_config
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit
from training.release import push_release

OTHER_GRAPH = DEFAULT_NODE_MODEL.parent / "pm2_5-antwerp-1h"  # N = 168 under an N = 360 manifest
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def kit(tmp_path: Path) -> ReleaseKit:
    return ReleaseKit(tmp_path / "kit")


def install(kit: ReleaseKit, release: Path, model_dir: Path) -> None:
    install_release(verify_release(release, kit.public_key, None), model_dir, "pm10")


def serving(kit: ReleaseKit, model_dir: Path) -> ModelSet:
    """What a fresh start of the daemon would serve (the daemon's own rule and trust)."""
    models = ModelSet({"pm10": model_dir}, trust={"pm10": ModelTrust("auto", kit.public_key)})
    models.refresh(force=True)
    return models


def snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry under ``directory``: file bytes, and symlink targets."""
    found: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            found[key] = f"-> {path.readlink()}"
        elif path.is_file():
            found[key] = path.read_bytes()
    return found


def test_a_signed_release_that_cannot_load_is_refused_and_nothing_changes(
    kit: ReleaseKit, tmp_path: Path
) -> None:
    model_dir = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), model_dir)
    before = snapshot(model_dir)
    bad = verify_release(kit.mismatched(kit.base_version + 1, OTHER_GRAPH), kit.public_key, None)
    with pytest.raises(UnloadableReleaseError, match=r"input shape \[-1, 168\]") as raised:
        install_release(bad, model_dir, "pm10")
    assert raised.value.reason == "unloadable"
    assert snapshot(model_dir) == before  # not a byte changed, no slot left behind
    models = serving(kit, model_dir)
    calibrator = models.get("pm10")
    assert calibrator is not None and calibrator.version == kit.base_version


def test_a_release_that_disagrees_with_its_golden_windows_is_refused(
    kit: ReleaseKit, tmp_path: Path
) -> None:
    model_dir = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), model_dir)
    good = kit.release(kit.base_version + 1, "gateway")
    golden = json.loads((good / GOLDEN_FILENAME).read_text())
    golden["expected"][3] += 0.5  # half a ug/m3 off on one window: another model
    bad = kit.resigned(good, "golden-off", {GOLDEN_FILENAME: json.dumps(golden).encode()})
    before = snapshot(model_dir)
    with pytest.raises(GoldenMismatchError, match="golden window 3"):
        install(kit, bad, model_dir)
    assert snapshot(model_dir) == before
    # The same release with its true golden windows installs; one without any (made before
    # golden windows existed) installs too, on load and test invoke alone.
    install(kit, good, model_dir)
    older = kit.resigned(kit.release(kit.base_version + 2, "gateway"), "no-golden", {
        GOLDEN_FILENAME: None
    })  # fmt: skip
    install(kit, older, model_dir)
    calibrator = serving(kit, model_dir).get("pm10")
    assert calibrator is not None and calibrator.version == kit.base_version + 2


def test_slots_switch_keep_the_previous_one_and_prune_the_rest(
    kit: ReleaseKit, tmp_path: Path
) -> None:
    model_dir = tmp_path / "pm10"
    for step in range(3):
        install(kit, kit.release(kit.base_version + step, "gateway"), model_dir)
    slots = sorted(p.name for p in (model_dir / SLOTS).iterdir())
    assert len(slots) == 2  # current and previous; the oldest was pruned
    assert str((model_dir / CURRENT).readlink()).startswith(f"{SLOTS}/v{kit.base_version + 2}-")
    assert str((model_dir / PREVIOUS).readlink()).startswith(f"{SLOTS}/v{kit.base_version + 1}-")
    assert [c.label for c in candidates(model_dir)] == ["current", "previous"]
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]


def test_start_falls_back_to_the_previous_slot_and_says_so(kit: ReleaseKit, tmp_path: Path) -> None:
    model_dir = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), model_dir)
    install(kit, kit.release(kit.base_version + 1, "gateway"), model_dir)
    graph = model_dir / CURRENT / "model.tflite"
    graph.write_bytes(graph.read_bytes()[:-64])  # the current slot rots on the SD card
    with structlog.testing.capture_logs() as logs:
        models = serving(kit, model_dir)
    calibrator = models.get("pm10")
    assert calibrator is not None and calibrator.version == kit.base_version
    stats = models.stats()["pm10"]
    assert stats["slot"] == "previous"
    assert "current:" in str(stats["fallback"]) and "corrupt" in str(stats["fallback"])
    [fallback] = [e for e in logs if e["event"] == "model_fallback"]
    assert fallback["serving"] == "previous" and fallback["version"] == kit.base_version
    assert models.missing() == []


def test_a_release_after_a_fallback_keeps_the_serving_model_as_previous(
    kit: ReleaseKit, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Serving ``previous`` (``current`` rotted), a release must keep the model that served as
    ``previous``, not the rotten slot: else the next fallback finds nothing that loads."""
    model_dir = tmp_path / "pm10"
    base = kit.base_version
    install(kit, kit.release(base, "gateway"), model_dir)
    install(kit, kit.release(base + 1, "gateway"), model_dir)
    rotten = (model_dir / CURRENT).resolve()
    graph = rotten / "model.tflite"
    graph.write_bytes(graph.read_bytes()[:-64])
    good = (model_dir / PREVIOUS).resolve()

    async def scenario() -> int | None:
        with collecting(mosquitto, ["tesla/gw1/ota/gateway"]) as collector:
            async with gateway(
                ota_config(kit, mosquitto), None, model_dirs={"pm10": model_dir}
            ) as gw:
                assert gw.models.stats()["pm10"]["slot"] == "previous"
                await asyncio.to_thread(
                    push_release, kit.release(base + 2, "gateway"), broker_config(mosquitto)
                )
                await eventually(lambda: bool(gateway_states(collector)), 10)
                calibrator = gw.models.get("pm10")
                return None if calibrator is None else calibrator.version

    assert asyncio.run(scenario()) == base + 2
    assert (model_dir / PREVIOUS).resolve() == good  # the model that served, kept
    assert not rotten.exists()  # the rotten slot was pruned
    graph = model_dir / CURRENT / "model.tflite"
    graph.write_bytes(graph.read_bytes()[:-64])  # and the new one rots too
    calibrator = serving(kit, model_dir).get("pm10")
    assert calibrator is not None and calibrator.version == base


def test_the_trust_rule_holds_for_slots(kit: ReleaseKit, tmp_path: Path) -> None:
    """A slot is writable by the daemon: it loads only through its signed release.json."""
    model_dir = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), model_dir)
    install(kit, kit.release(kit.base_version + 1, "gateway"), model_dir)
    (model_dir / CURRENT / "release.json").unlink()  # someone dropped unsigned files in
    models = serving(kit, model_dir)
    assert models.stats()["pm10"]["slot"] == "previous"
    assert "no release.json" in str(models.stats()["pm10"]["fallback"])
    (model_dir / PREVIOUS / "release.json").unlink()
    models = serving(kit, model_dir)
    assert models.missing() == ["pm10"]
    [result] = models.refresh(force=True)
    assert result.outcome is ReloadOutcome.REJECTED
    assert "current:" in str(result.error) and "previous:" in str(result.error)


def test_check_config_applies_the_daemons_rule(
    kit: ReleaseKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), model_dir)
    install(kit, kit.release(kit.base_version + 1, "gateway"), model_dir)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'gateway_id = "gw"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{model_dir}"\n',
        encoding="utf-8",
    )
    assert main(["check-config", "--config", str(config)]) == 0
    assert f"v{kit.base_version + 1} " in capsys.readouterr().out
    for link in (CURRENT, PREVIOUS):
        graph = model_dir / link / "model.tflite"
        graph.write_bytes(graph.read_bytes()[:-64])
        code = main(["check-config", "--config", str(config)])
        out, err = capsys.readouterr()
        if link == CURRENT:
            assert code == 0
            assert f"v{kit.base_version} " in out and "FALLBACK to previous" in out
        else:
            assert code == 1  # nothing would serve: the daemon would start degraded
            assert "REFUSED: current:" in err and "previous:" in err
    assert main(["check-config", "--skip-models", "--config", str(config)]) == 0


# What the child runs: the real install, killed (SIGKILL) just before its k-th change to the
# file system (mkdir, write-fsync, rename, symlink, unlink, rmdir), whatever the installer is.
_KILLED_INSTALL = """
import os, signal, sys
from pathlib import Path
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release

release_dir, key, model_dir, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
release = verify_release(Path(release_dir), bytes.fromhex(key), None)
calls = 0

def killing(function):
    def wrapped(*args, **kwargs):
        global calls
        if calls == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls += 1
        return function(*args, **kwargs)
    return wrapped

for name in ("mkdir", "fsync", "rename", "replace", "symlink", "unlink", "remove", "rmdir"):
    setattr(os, name, killing(getattr(os, name)))
install_release(release, Path(model_dir), "pm10")
print(calls)
"""


def _install_killed_at(kit: ReleaseKit, release: Path, model_dir: Path, kill_at: int) -> int:
    result = subprocess.run(
        [
            *(sys.executable, "-c", _KILLED_INSTALL),
            *(str(release), kit.public_key.hex(), str(model_dir), str(kill_at)),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if result.returncode == 0:
        return int(result.stdout.split()[-1])
    assert result.returncode == -9, result.stderr[-3000:]
    return -1


def test_a_kill_at_every_step_of_an_install_leaves_old_or_new_never_a_mix(
    kit: ReleaseKit, tmp_path: Path
) -> None:
    old, new = kit.base_version + 1, kit.base_version + 2
    pristine = tmp_path / "pristine"  # current and previous: the install also prunes a slot
    install(kit, kit.release(kit.base_version, "gateway"), pristine)
    install(kit, kit.release(old, "gateway"), pristine)
    release = kit.release(new, "gateway")
    steps = _install_killed_at(kit, release, tmp_path / "count", 10**9)
    assert steps > 5, steps
    seen = set()
    for kill_at in range(steps):
        model_dir = tmp_path / f"killed-at-{kill_at}"
        shutil.copytree(pristine, model_dir, symlinks=True)
        assert _install_killed_at(kit, release, model_dir, kill_at) == -1
        calibrator = serving(kit, model_dir).get("pm10")  # the next start
        assert calibrator is not None, f"nothing serves after a kill at step {kill_at}"
        assert calibrator.version in {old, new}
        seen.add(calibrator.version)
        install(kit, release, model_dir)  # the retained release, redelivered after the restart
        calibrator = serving(kit, model_dir).get("pm10")
        assert calibrator is not None and calibrator.version == new, kill_at
    assert seen == {old, new}  # the kills fell both before and after the switch


# -- the slot directory itself (survivors of make mutation) -------------------------------------


def test_candidates_of_a_directory_without_slots_and_of_links_pointed_elsewhere(
    tmp_path: Path,
) -> None:
    assert candidates(tmp_path) == [Candidate("directory", tmp_path)]
    (tmp_path / CURRENT).symlink_to("elsewhere/v1-0123abcd")  # two parts, not under slots/
    (tmp_path / PREVIOUS).symlink_to(f"{SLOTS}/not-a-slot-name")
    assert candidates(tmp_path) == [
        Candidate("current", tmp_path / CURRENT),  # tried as the operator pointed them
        Candidate("previous", tmp_path / PREVIOUS),
    ]


def test_staging_writes_readable_files_beside_the_slots_never_in_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-temp-dir"))
    slots = ModelSlots(tmp_path / "pm10")
    slot = slots.stage(3, {"manifest.json": b"{}", "model.tflite": b"x"})
    assert slot.parent == tmp_path / "pm10" / SLOTS and slot.name.startswith("v3-")
    assert stat.S_IMODE(slot.stat().st_mode) == 0o755
    assert {stat.S_IMODE((slot / n).stat().st_mode) for n in ("manifest.json", "model.tflite")} == {
        0o644
    }


def test_commit_keeps_the_serving_slot_as_previous(tmp_path: Path) -> None:
    slots = ModelSlots(tmp_path)
    a, b, c, d = (slots.stage(version, {"m": b"x"}) for version in range(4))
    slots.commit(a)
    slots.commit(b)
    assert (slots.current(), slots.previous()) == (b, a)
    slots.commit(d, keep=c)  # c serves (a fallback): it becomes previous, not b
    assert (slots.current(), slots.previous()) == (d, c)


def test_prune_removes_strays_and_temp_links_and_says_what(tmp_path: Path) -> None:
    slots = ModelSlots(tmp_path)
    assert slots.prune() == []  # no slots directory yet: nothing, no error
    a, b, c = (slots.stage(version, {"m": b"x"}) for version in range(3))
    slots.commit(a)
    slots.commit(b)
    (slots.slots_dir / "stray-file").write_text("not a slot")
    (tmp_path / ".current.0badf00d.tmp").symlink_to(f"{SLOTS}/{c.name}")  # a killed install
    removed = slots.prune()
    assert {c.name, ".current.0badf00d.tmp"} <= set(removed)
    assert not c.exists() and a.is_dir() and b.is_dir()
    assert not (tmp_path / ".current.0badf00d.tmp").is_symlink()
    slots.discard(c)  # already gone: nothing to do
    slots.discard(a)  # previous: kept
    assert a.is_dir()
