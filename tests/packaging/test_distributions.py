"""What the published distributions say about themselves (issue 27 part 7): the license the
metadata names ships as text, the summary says what the wheel holds, and ``twine check
--strict`` (what PyPI's upload checks) accepts the wheel and the sdist.

The wheel is the session's (tests/conftest.py, as ``make wheel`` builds it); the sdist is built
from the same copy of the checkout's files (devkit.wheel.build_sdist).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

from devkit.wheel import REPO, build_sdist

pytestmark = pytest.mark.slow

# The sdist's top level: the build's files, the license, and what setup.py maps into the package.
SDIST_TOP = {
    "LICENSE",
    "MANIFEST.in",
    "PKG-INFO",
    "README.md",
    "deploy",
    "models",
    "pyproject.toml",
    "setup.cfg",
    "setup.py",
    "tesla_gateway",
    "tesla_gateway.egg-info",
}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sdist(tmp_path_factory.mktemp("sdist"))


def wheel_metadata(wheel: Path) -> tuple[Message, zipfile.ZipFile]:
    archive = zipfile.ZipFile(wheel)
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    return Parser().parsestr(archive.read(name).decode("utf-8")), archive


def test_twine_check_strict_accepts_the_wheel_and_the_sdist(
    gateway_wheel: Path, sdist: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(gateway_wheel), str(sdist)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_wheel_carries_its_license_and_says_what_it_holds(gateway_wheel: Path) -> None:
    metadata, archive = wheel_metadata(gateway_wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    license_name = next(n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
    text = archive.read(license_name)
    assert text == (REPO / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    assert b"END OF TERMS AND CONDITIONS" in text
    # The summary describes this wheel: the daemon and its default models, not the training
    # or the firmware (which stay in the repository).
    summary = metadata["Summary"]
    assert summary.startswith("Gateway daemon that calibrates low-cost particulate sensors")
    assert "default models included" in summary
    assert "training and node firmware are in the source repository" in summary
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_the_sdist_holds_the_gateway_and_its_license_only(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        root = names[0].split("/")[0]
        top = {name.split("/")[1] for name in names if name.count("/") >= 1}
        license_text = archive.extractfile(f"{root}/LICENSE")
        assert license_text is not None
        assert license_text.read() == (REPO / "LICENSE").read_bytes()
    assert top == SDIST_TOP
    assert f"{root}/models/pm10-ispra-1min/manifest.json" in names
