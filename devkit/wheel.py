"""The one wheel builder (``make wheel``, the tests), the sdist builder the packaging tests
check, and the fresh-venv installer the tests use.

``build_wheel`` builds from a copy of the checkout's sources, never in place: setuptools' build/
folder would otherwise carry files deleted since an earlier build into the next wheel. Every
top-level package is copied, so what the wheel holds is pyproject.toml's and setup.py's choice.

``install_into_venv`` installs a wheel into a new venv with exactly its runtime dependencies, from
a wheelhouse of their wheels (filled once through pip's configured index, then offline).

Standard library only: ``python3 -m devkit.wheel`` runs from a checkout with no venv;
``build_sdist`` calls the running interpreter's setuptools (the dev venv's).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from devkit.errors import DevkitError

__all__ = ["WheelError", "build_sdist", "build_wheel", "install_into_venv", "main"]

REPO = Path(__file__).resolve().parents[1]
# Besides the packages: the build's own files and the data setup.py maps into the package.
_BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")
_DATA = ("models", "deploy/gateway.example.toml")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


class WheelError(DevkitError):
    """Building or installing the wheel failed; the message carries pip's output."""


@contextlib.contextmanager
def _source_copy(repo: Path) -> Iterator[Path]:
    """The build's files, every top-level package and the mapped data, copied to a scratch
    folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tesla-wheel-") as scratch:
        source = Path(scratch) / "src"
        source.mkdir()
        for name in _BUILD_FILES:
            shutil.copy2(repo / name, source / name)
        for package in sorted(p for p in repo.iterdir() if (p / "__init__.py").is_file()):
            shutil.copytree(package, source / package.name, ignore=_IGNORE)
        for name in _DATA:
            _copy(repo / name, source / name)
        yield source


def build_sdist(out_dir: Path, *, repo: Path = REPO) -> Path:
    """Build the gateway's source distribution into ``out_dir`` (the same files the wheel is
    built from) with the running interpreter's setuptools; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with _source_copy(repo) as source:
        hook = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
        result = subprocess.run(  # noqa: S603  # our interpreter, fixed arguments
            [sys.executable, "-c", hook, str(out_dir)],
            capture_output=True,
            text=True,
            check=False,
            cwd=source,
        )
    if result.returncode != 0:
        raise WheelError(f"building the sdist failed:\n{result.stdout}{result.stderr}")
    return out_dir / result.stdout.strip().splitlines()[-1]


def build_wheel(out_dir: Path, *, build_isolation: bool = True, repo: Path = REPO) -> Path:
    """Build the gateway wheel into ``out_dir`` and return its path.

    With ``build_isolation`` pip fetches the build requirements (setuptools) as a user's build
    would; without it the running interpreter's setuptools builds (offline, faster).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with _source_copy(repo) as source:
        _pip(
            "wheel",
            "--no-deps",
            *(() if build_isolation else ("--no-build-isolation",)),
            "--wheel-dir",
            str(out_dir),
            str(source),
        )
    built = sorted(out_dir.glob("tesla_gateway-*.whl"), key=lambda path: path.stat().st_mtime)
    if not built:
        raise WheelError(f"pip reported success but left no tesla_gateway wheel in {out_dir}")
    return built[-1]


def install_into_venv(wheel: Path, venv: Path, wheelhouse: Path) -> Path:
    """Create ``venv`` (no pip inside: this pip installs into it) with ``wheel`` and its runtime
    dependencies only; returns the venv's python.

    The dependencies come from ``wheelhouse`` with no index; a missing one is first downloaded
    there through pip's configured index (once: later runs are offline).
    """
    subprocess.run(  # noqa: S603  # our interpreter, fixed arguments
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
    )
    python = venv / "bin" / "python"
    offline = ["--python", str(python), "install", "--no-compile", "--no-index"]
    offline += ["--find-links", str(wheelhouse), str(wheel)]
    try:
        _pip(*offline)
    except WheelError:
        _fill_wheelhouse(wheel, wheelhouse)
        _pip(*offline)
    return python


def _fill_wheelhouse(wheel: Path, wheelhouse: Path) -> None:
    """Download ``wheel``'s dependencies into ``wheelhouse``, each file renamed into place whole
    (another test run may be reading the wheelhouse meanwhile)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheelhouse) as scratch:
        _pip("download", "--dest", scratch, str(wheel))
        for path in Path(scratch).iterdir():
            if path.name != wheel.name:  # the wheel under test is never kept
                path.replace(wheelhouse / path.name)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=_IGNORE)
    else:
        shutil.copy2(source, target)


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"]
    # A PYTHONPATH holding the checkout (whose tesla_gateway.egg-info says "installed") would
    # make pip skip the wheel under test in the target venv.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(  # noqa: S603
        command, capture_output=True, text=True, check=False, env=env
    )
    if result.returncode != 0:
        raise WheelError(
            f"`pip {' '.join(args)}` failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devkit.wheel --out dist``: build the gateway wheel (``make wheel``)."""
    parser = argparse.ArgumentParser(prog="python -m devkit.wheel", description=main.__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="folder for the wheel")
    parser.add_argument(
        "--no-build-isolation",
        action="store_true",
        help="build with this interpreter's setuptools instead of fetching it (offline)",
    )
    args = parser.parse_args(argv)
    try:
        wheel = build_wheel(args.out, build_isolation=not args.no_build_isolation)
    except WheelError as exc:
        print(f"devkit.wheel: {exc}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
