"""The default models and the example configuration the gateway ships with.

An installed wheel holds them inside the package (``tesla_gateway/default_models/<model>/``,
``tesla_gateway/examples/gateway.example.toml``; setup.py maps them from ``models/`` and
``deploy/``),
so a Pi with no checkout finds them through ``importlib.resources``. Run from a checkout (the
dev venv, an editable install), the package folder has neither and the checkout's own
``models/`` and ``deploy/`` are used: the same files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from tesla_gateway.contract.manifest import MANIFEST_FILENAME, Manifest, load_manifest
from tesla_gateway.contract.time_of_day import is_hour_channel
from tesla_gateway.errors import GatewayError, ManifestError

__all__ = [
    "BundledDataError",
    "bundled_model_dirs",
    "bundled_models",
    "bundled_models_dir",
    "example_config",
]

_PACKAGE = "tesla_gateway"
_MODELS = "default_models"
_EXAMPLES = "examples"
_EXAMPLE_CONFIG = "gateway.example.toml"
_CHECKOUT = Path(__file__).resolve().parents[2]


class BundledDataError(GatewayError):
    """The installed package lacks the files the wheel should have carried."""


def bundled_models_dir() -> Path:
    """The folder of default model directories (one per model, each with its manifest)."""
    return _first_existing(_packaged(_MODELS), _CHECKOUT / "models", what="default models")


def example_config() -> Path:
    """The commented example configuration (every section, with its defaults)."""
    return _first_existing(
        _packaged(_EXAMPLES, _EXAMPLE_CONFIG),
        _CHECKOUT / "deploy" / _EXAMPLE_CONFIG,
        what="example configuration",
    )


def bundled_models() -> dict[str, list[Path]]:
    """Feature -> its default model directories, as the manifests say (not the folder names),
    the model with the fewest input channels read from sensors first (it serves every sensor
    of the feature; a covariate model serves those that report its extra channels)."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for model_dir in sorted(bundled_models_dir().iterdir()):
        if not (model_dir / MANIFEST_FILENAME).is_file():
            continue
        try:
            manifest = load_manifest(model_dir)
        except ManifestError as exc:
            raise BundledDataError(f"default model {model_dir} is damaged: {exc}") from exc
        found.setdefault(manifest.feature, []).append((_read_channels(manifest), model_dir))
    if not found:
        raise BundledDataError(f"no default model in {bundled_models_dir()}: reinstall the wheel")
    models: dict[str, list[Path]] = {}
    for feature, entries in found.items():
        counts = [count for count, _ in entries]
        if len(set(counts)) != len(counts):
            raise BundledDataError(
                f"two default models of {feature} take as many channels: "
                f"{', '.join(str(path) for _, path in entries)}"
            )
        models[feature] = [path for _, path in sorted(entries)]
    return models


def bundled_model_dirs() -> dict[str, Path]:
    """Slot id -> default model directory, as ``init`` writes them (the feature names its
    first model, the directory's name the others: tesla_gateway.daemon.config.model_slot_ids)."""
    slots: dict[str, Path] = {}
    for feature, paths in bundled_models().items():
        slots[feature] = paths[0]
        for path in paths[1:]:
            slots[path.name] = path
    return slots


def _packaged(*parts: str) -> Path | None:
    """``tesla_gateway/<parts>`` of the installed package as a file system path, or None.

    pip installs wheels unpacked, so the resource is a real file the configuration can name
    after this process exits; a zipped import has no such path, and counts as missing.
    """
    resource = files(_PACKAGE).joinpath(*parts)
    return resource if isinstance(resource, Path) else None


def _first_existing(*candidates: Path | None, what: str) -> Path:
    paths = [candidate for candidate in candidates if candidate is not None]
    for path in paths:
        if path.exists():
            return path
    raise BundledDataError(
        f"the gateway's {what} are missing (looked in {', '.join(map(str, paths))}): "
        "install the gateway from its wheel (`make wheel`) or run it from a checkout"
    )


def _read_channels(manifest: Manifest) -> int:
    """Channels a sensor must send (the hour of the day is derived, every sensor has it)."""
    return sum(not is_hour_channel(name) for name in manifest.channel_names)
