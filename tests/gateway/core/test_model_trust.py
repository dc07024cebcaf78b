"""The trust rule: a model directory the daemon can write is loaded only through a signed release.

Tests run as root, for whom every directory is writable; the read-only case runs the check in a
child process that imports the gateway as root and then drops to the unprivileged ``nobody`` user,
as the systemd service runs it. Importing before the drop keeps the test independent of where the
checkout lives (a clone under a 0700 home directory is unreadable for ``nobody``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tesla_gateway.contract.manifest import load_manifest, sha256_file, write_manifest
from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError
from tesla_gateway.models.calibrator import Calibrator
from tesla_gateway.models.trust import ModelTrust, UntrustedModelError
from tesla_gateway.ota.install import install_release
from tesla_gateway.ota.release import RELEASE_FILENAME, verify_release
from tests.support.releases import DEFAULT_NODE_MODEL, ReleaseKit


@pytest.fixture
def kit(tmp_path: Path) -> ReleaseKit:
    return ReleaseKit(tmp_path / "kit")


def installed(kit: ReleaseKit, version: int, model_dir: Path) -> Path:
    """Install a signed release; returns the slot it serves from (``<model_dir>/current``)."""
    release = verify_release(kit.release(version, "gateway"), kit.public_key, None)
    install_release(release, model_dir, "pm10")
    return model_dir / "current"


def test_signed_install_loads_and_says_so(kit: ReleaseKit, tmp_path: Path) -> None:
    model_dir = installed(kit, kit.base_version + 1, tmp_path / "models" / "pm10")
    assert (model_dir / RELEASE_FILENAME).is_file()
    calibrator = Calibrator.load(model_dir, trust=ModelTrust("auto", kit.public_key))
    assert calibrator.version == kit.base_version + 1
    assert calibrator.trust.startswith(f"signed release v{kit.base_version + 1}")


def test_writable_unsigned_directory_is_refused_when_a_key_is_configured(
    kit: ReleaseKit, tmp_path: Path
) -> None:
    model_dir = tmp_path / "dropped-in"
    shutil.copytree(DEFAULT_NODE_MODEL, model_dir)
    with pytest.raises(UntrustedModelError, match=r"no release\.json"):
        Calibrator.load(model_dir, trust=ModelTrust("auto", kit.public_key))
    # Without a key there is nothing to check against: sha256 only, and the reason is kept.
    calibrator = Calibrator.load(model_dir, trust=ModelTrust("auto", None))
    assert "no release key" in calibrator.trust
    assert Calibrator.load(model_dir, trust=ModelTrust("off", kit.public_key)).trust.startswith(
        "sha256 only"
    )


def test_model_replaced_after_install_is_refused(kit: ReleaseKit, tmp_path: Path) -> None:
    """Whoever can write the directory can rewrite the manifest to match a new file: the
    signed hashes in release.json still catch it."""
    model_dir = installed(kit, kit.base_version + 1, tmp_path / "pm10")
    manifest = load_manifest(model_dir)
    float_file = model_dir / manifest.files["float32"].path
    float_file.write_bytes(float_file.read_bytes() + b"\0" * 16)
    files = dict(manifest.files)
    files["float32"] = files["float32"].model_copy(
        update={"sha256": sha256_file(float_file), "size_bytes": float_file.stat().st_size}
    )
    write_manifest(model_dir, manifest.model_copy(update={"files": files}))
    with pytest.raises(UntrustedModelError, match="differs from the signed"):
        Calibrator.load(model_dir, trust=ModelTrust("auto", kit.public_key))


def test_release_signed_by_another_key_is_refused(kit: ReleaseKit, tmp_path: Path) -> None:
    model_dir = installed(kit, kit.base_version + 1, tmp_path / "pm10")
    other = ReleaseKit(tmp_path / "other")
    with pytest.raises(UntrustedModelError, match="signed by key"):
        Calibrator.load(model_dir, trust=ModelTrust("auto", other.public_key))


def test_required_needs_a_key(tmp_path: Path) -> None:
    with pytest.raises(UntrustedModelError, match="no release key"):
        ModelTrust("required", None).check(DEFAULT_NODE_MODEL, load_manifest(DEFAULT_NODE_MODEL))
    config = tmp_path / "gw.toml"
    config.write_text(
        'gateway_id = "gw"\nstate_dir = "state"\n[[models]]\nfeature = "pm10"\n'
        f'model_dir = "{DEFAULT_NODE_MODEL}"\nsignature = "required"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"add an \[ota\] section"):
        load_config(config, environ={})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to the nobody user")
def test_read_only_directory_is_trusted_on_its_sha256(kit: ReleaseKit) -> None:
    """As the unprivileged service user: a root-owned read-only directory (the installer's
    default models) needs no signature; one it may write does."""
    with tempfile.TemporaryDirectory(prefix="trust-") as scratch:
        tmp_path = Path(scratch)
        tmp_path.chmod(0o755)  # pytest's own tmp_path is private to root
        check_as_nobody(kit, tmp_path)


def check_as_nobody(kit: ReleaseKit, tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    shutil.copytree(DEFAULT_NODE_MODEL, read_only)
    writable = tmp_path / "rw"
    shutil.copytree(DEFAULT_NODE_MODEL, writable)
    shutil.chown(writable, "nobody")
    key = tmp_path / "release.pub"
    key.write_text(kit.public_key.hex(), encoding="ascii")
    script = (
        "import json, os, pwd, sys\n"
        "from pathlib import Path\n"
        "from tesla_gateway.contract.manifest import load_manifest\n"
        "from tesla_gateway.models.trust import ModelTrust, UntrustedModelError\n"
        "key = bytes.fromhex(Path(sys.argv[1]).read_text())\n"
        "nobody = pwd.getpwnam('nobody')\n"
        "os.setgroups([])\n"
        "os.setgid(nobody.pw_gid)\n"
        "os.setuid(nobody.pw_uid)\n"
        "trust = ModelTrust('auto', key)\n"
        "out = {'uid': os.getuid()}\n"
        "for d in sys.argv[2:]:\n"
        "    try:\n"
        "        out[d] = trust.check(Path(d), load_manifest(Path(d)))\n"
        "    except UntrustedModelError as exc:\n"
        "        out[d] = 'refused: ' + str(exc)\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(key), str(read_only), str(writable)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    verdicts = json.loads(result.stdout)
    assert verdicts["uid"] == pwd.getpwnam("nobody").pw_uid
    assert verdicts[str(read_only)] == "sha256; read-only for the daemon"
    assert verdicts[str(writable)].startswith("refused: ")
