"""A cell's finished training, kept so a bench stopped during export or measurement resumes there.

Training is most of a cell's cost (an Informer cell of the paper protocol: 20-60 min to train,
then 4-6 min to export), and a long run is often stopped (a session ends, a machine reboots)
between the two. ``train`` writes the run directory; once it has returned, a marker naming the
cell's fingerprint and training time is written atomically beside it. The next invocation reuses
the run only when that marker is present and names the same fingerprint, and the run's own
``config.json`` is the cell's training config; anything else (no marker, another fingerprint, a
file that no longer loads) trains again from scratch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from training.errors import RunDirError
from training.train import RunResult, TrainConfig, load_result

__all__ = ["MARKER_NAME", "TrainedRun", "forget_trained", "mark_trained", "reuse_trained"]

MARKER_NAME = "bench-trained.json"


@dataclass(frozen=True)
class TrainedRun:
    result: RunResult
    train_seconds: float


def mark_trained(run_dir: Path, fingerprint: str, train_seconds: float) -> None:
    """Record that ``run_dir`` holds this cell's finished training (written last, atomically)."""
    marker = run_dir / MARKER_NAME
    partial = marker.with_suffix(".partial")
    payload = {"fingerprint": fingerprint, "train_seconds": round(train_seconds, 2)}
    with partial.open("w", encoding="utf-8") as handle:
        json.dump(payload, handle, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(marker)


def forget_trained(run_dir: Path) -> None:
    """Drop the marker before training again, so a run stopped half-written is never reused."""
    (run_dir / MARKER_NAME).unlink(missing_ok=True)


def _recorded_seconds(marker: Path, fingerprint: str) -> float | str | None:
    """The marker's training time if it names this fingerprint; a reason if it is unreadable."""
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"unreadable {marker.name}: {exc}"
    if not isinstance(recorded, dict) or recorded.get("fingerprint") != fingerprint:
        return None
    seconds = recorded.get("train_seconds")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return f"{marker.name} has no training time"
    return float(seconds)


def reuse_trained(run_dir: Path, fingerprint: str, config: TrainConfig) -> TrainedRun | str | None:
    """The finished run for this fingerprint; a reason (str) when one is there but unusable.

    ``None`` means there is nothing to reuse (no marker, or a marker of another configuration);
    a string says why a run that claims to be this cell's could not be used.
    """
    seconds = _recorded_seconds(run_dir / MARKER_NAME, fingerprint)
    if not isinstance(seconds, float):
        return seconds
    try:  # the small file first: a run of another configuration never loads its Keras model
        stored = TrainConfig.model_validate_json((run_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:  # a pydantic ValidationError is a ValueError
        return f"the run's config.json does not load: {str(exc).splitlines()[0]}"
    if stored != config:
        return "the run's config.json is not this cell's training config"
    try:
        result = load_result(run_dir)
    except RunDirError as exc:
        return str(exc)
    return TrainedRun(result=result, train_seconds=seconds)
