"""A signed release whose graph computes no concentration is refused at install: ``implausible``.

Real: tiny LiteRT graphs whose output the test chooses (tests/support/models.py ``affine``),
signed by the real release tool (its golden windows are what the graph computes, so they
agree), installed by the real install path into a real model directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.ota.errors import ImplausibleReleaseError
from tesla_gateway.ota.golden import GOLDEN_FILENAME
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import verify_release
from tests.support.models import ModelFactory
from tests.support.releases import ReleaseKit

SANE = {"affine": (0.8, 1.0)}  # out = 0.8 x raw + 1: a calibration
HUGE = {"affine": (-500.0, 0.0)}  # raw 20 -> -10,000: the graph


def snapshot(directory: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            found[key] = f"-> {path.readlink()}"
        elif path.is_file():
            found[key] = path.read_bytes()
    return found


def install(kit: ReleaseKit, release: Path, model_dir: Path) -> None:
    install_release(verify_release(release, kit.public_key, None), model_dir, "pm10")


@pytest.fixture
def model_dir(model_factory: ModelFactory, tmp_path: Path) -> Path:
    """A model directory already serving a sane release."""
    kit = ReleaseKit(tmp_path / "sane-kit", model_factory.get(**SANE).path)
    directory = tmp_path / "pm10"
    install(kit, kit.release(kit.base_version, "gateway"), directory)
    return directory


def test_a_signed_release_emitting_ten_thousands_is_refused_and_nothing_changes(
    model_factory: ModelFactory, model_dir: Path, tmp_path: Path
) -> None:
    kit = ReleaseKit(tmp_path / "huge-kit", model_factory.get(**HUGE).path)
    release = kit.release(kit.base_version + 1, "gateway")
    before = snapshot(model_dir)
    with pytest.raises(ImplausibleReleaseError) as raised:
        install(kit, release, model_dir)
    assert raised.value.reason == "implausible"
    message = str(raised.value)
    # The first golden window is constant at the training inputs' p01 (1 ug/m3): -500 out.
    assert "golden window 0" in message and "-500 µg/m³ lies below zero" in message
    assert snapshot(model_dir) == before  # not a byte changed, no slot left behind


def test_without_golden_windows_the_training_range_is_the_reference(
    model_factory: ModelFactory, model_dir: Path, tmp_path: Path
) -> None:
    """A release made before golden windows existed is checked on constant windows at the
    training inputs' p01, p50 and p99."""
    kit = ReleaseKit(tmp_path / "huge-kit", model_factory.get(**HUGE).path)
    older = kit.resigned(
        kit.release(kit.base_version + 1, "gateway"), "no-golden", {GOLDEN_FILENAME: None}
    )
    before = snapshot(model_dir)
    with pytest.raises(ImplausibleReleaseError, match="constant window"):
        install(kit, older, model_dir)
    assert snapshot(model_dir) == before


def test_a_release_far_above_its_training_range_is_refused(
    model_factory: ModelFactory, model_dir: Path, tmp_path: Path
) -> None:
    # out = 50 x raw: at the inputs' p99 (200) 10,000 > 4 x max(input max 500, 200) = 2,000.
    kit = ReleaseKit(tmp_path / "high-kit", model_factory.get(affine=(50.0, 0.0)).path)
    with pytest.raises(ImplausibleReleaseError, match=r"exceeds 4 x max\(trained maximum 500"):
        install(kit, kit.release(kit.base_version + 1, "gateway"), model_dir)
