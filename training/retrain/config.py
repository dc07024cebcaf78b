"""What one retraining run is asked to do: :class:`RetrainConfig`, validated once."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tesla_gateway.mqtt.config import MqttBrokerConfig
from training.models import ModelConfig
from training.release import DEFAULT_TOPIC_PREFIX
from training.retrain.data import HoldBack

__all__ = ["Mode", "RetrainConfig"]

Mode = Literal["auto", "finetune", "fresh"]


class RetrainConfig(BaseModel):
    """One retraining run; defaults keep the champion's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    champion: Path = Field(description="Model directory in service (manifest.json + FlatBuffers).")
    pairs: Path = Field(description="<state_dir>/pairs/<feature> of the gateway (or a copy).")
    champion_run: Path | None = Field(
        default=None, description="The champion's training run directory: enables fine-tuning."
    )
    mode: Mode = Field(
        default="auto",
        description="finetune (needs champion_run), fresh, or auto (finetune when possible).",
    )
    since: datetime | None = Field(
        default=None,
        description="Use only pairs from this time on (e.g. the start of a drift); ISO-8601, UTC.",
    )
    dataset: str | None = Field(
        default=None, description="Original training data (registry name) trained on as well."
    )
    data_path: Path | None = Field(default=None, description="Folder or file for 'dataset'.")
    dataset_options: dict[str, int | float | str] = Field(default_factory=dict)
    holdout: HoldBack = Field(default_factory=lambda: HoldBack.model_validate("0.25"))
    validation_fraction: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="Most recent share of the training pairs that selects the epoch; 0: none.",
    )
    margin: float = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        description="The challenger's RMSE must be at most (1 - margin) x the champion's.",
    )
    min_improvement: float = Field(
        default=0.0, ge=0.0, description="... and at least this much lower, in the feature's unit."
    )
    min_holdout_windows: int = Field(default=30, ge=1)
    min_train_windows: int = Field(default=30, ge=1)
    epochs: int = Field(default=10, ge=1)
    batch_size: int | None = Field(default=None, ge=1, description="Default: the champion's.")
    learning_rate: float | None = Field(default=None, gt=0, description="Default: the champion's.")
    early_stopping_patience: int = Field(default=3, ge=1)
    seed: int = 0
    partial_history_fraction: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "Share of training windows truncated to a random history (training/history.py), so "
            "the challenger calibrates young sensors too; default: 0.5 when the champion "
            "calibrates from fewer than N periods, else 0."
        ),
    )
    pairs_weight: int = Field(
        default=1, ge=1, description="Each pairs window is seen this many times per epoch."
    )
    max_original_windows: int | None = Field(
        default=None, ge=1, description="Cap on original-data windows (random subset)."
    )
    model: ModelConfig | None = Field(
        default=None, description="Another architecture for a fresh challenger."
    )
    window_length: int | None = Field(default=None, ge=1, description="Another N (fresh only).")
    name: str | None = Field(default=None, description="Model name; default: the champion's.")
    key: Path | None = Field(default=None, description="Private key: sign an accepted challenger.")
    target: Literal["gateway", "node"] = "gateway"
    push: MqttBrokerConfig | None = Field(
        default=None, description="Publish the signed release on this broker (as `push` does)."
    )
    topic_prefix: str = Field(
        default=DEFAULT_TOPIC_PREFIX, min_length=1, description="Releases' topic prefix."
    )

    @model_validator(mode="after")
    def _consistent(self) -> RetrainConfig:
        if self.push is not None and self.key is None:
            raise ValueError("pushing needs a signed release: give the private key too")
        if self.mode == "finetune" and self.champion_run is None:
            raise ValueError("mode 'finetune' needs the champion's run directory (champion_run)")
        if self.mode == "finetune" and (self.model is not None or self.window_length is not None):
            raise ValueError("another model or window length needs mode 'fresh'")
        if self.data_path is not None and self.dataset is None:
            raise ValueError("data_path without dataset: name the original dataset")
        return self
