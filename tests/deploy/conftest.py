"""An installed tree, built once per module by deploy/install.sh into a throwaway root.

What cannot exist here is faked and said so: the target root is a plain directory with a
minimal Debian ``/etc`` (passwd, group, shadow, gshadow with root, dialout and mosquitto), as
Raspberry Pi OS has after ``apt-get install mosquitto``; the gateway's wheel is built from this
checkout (the session's ``gateway_wheel``) and installed offline with ``--no-deps`` (tests do
not download numpy and LiteRT; on the Pi pip fetches them), so the venv holds the gateway but
not its dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "deploy" / "install.sh"
UNINSTALL = REPO / "deploy" / "uninstall.sh"
GATEWAY_ID = "gw1"
NODES = ("node-01", "node-02")

BASE_ETC = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\n",
    "group": "root:x:0:\ndialout:x:20:\nmosquitto:x:101:\n",
    "shadow": "root:*:19000:0:99999:7:::\n",
    "gshadow": "root:*::\ndialout:*::\nmosquitto:!::\n",
}


@dataclass(frozen=True)
class InstalledRoot:
    root: Path
    wheelhouse: Path
    first_run: str

    def install_args(self, *extra: str) -> list[str]:
        return install_command(self.root, *extra, wheelhouse=self.wheelhouse)


def install_command(root: Path, *extra: str, wheelhouse: Path | None = None) -> list[str]:
    """install.sh into ``root`` for this test gateway and its nodes (a dry run needs no wheel)."""
    args = [str(INSTALL), "--root", str(root), "--arch", "arm64", "--gateway-id", GATEWAY_ID]
    if wheelhouse is not None:
        args += ["--wheelhouse", str(wheelhouse), "--pip-args", "--no-index --no-deps"]
    for node in NODES:
        args += ["--node", node]
    return [*args, *extra]


def make_base_root(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    for name, text in BASE_ETC.items():
        (root / "etc" / name).write_text(text, encoding="utf-8")


def adopt_venv(installed_root: InstalledRoot, root: Path) -> None:
    """Give ``root`` the shared install's venv: install.sh finds it up to date (its stamp) and
    skips pip, so a test's private install takes seconds."""
    venv = Path("opt/tesla-gateway/venv")
    shutil.copytree(installed_root.root / venv, root / venv, symlinks=True)


@pytest.fixture(scope="package")
def installed_root(
    tmp_path_factory: pytest.TempPathFactory, gateway_wheel: Path
) -> Iterator[InstalledRoot]:
    if os.geteuid() != 0:  # useradd --root and chown; the dry-run tests still run
        pytest.skip("install.sh installs as root (useradd --root, chown): run as root to test it")
    base = tmp_path_factory.mktemp("deploy")
    root = base / "root"
    make_base_root(root)
    wheelhouse = gateway_wheel.parent  # the session's wheel (tests/conftest.py), alone there
    partial = InstalledRoot(root=root, wheelhouse=wheelhouse, first_run="")
    result = subprocess.run(partial.install_args(), capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    yield InstalledRoot(root=root, wheelhouse=wheelhouse, first_run=result.stdout)
