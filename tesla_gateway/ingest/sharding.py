"""Sharding sensors over several gateways: a consistent hash of the sensor id picks the shard.

Every gateway of a deployment subscribes to the same topics and keeps only the readings of the
sensors its shard owns, so no coordination is needed: each sensor's window lives in exactly one
gateway. The hash is jump consistent hashing (Lamping and Veach, 2014) over the first 8 bytes
of the sensor id's SHA-256: uniform, stable across processes and Python versions (unlike
``hash()``), and when ``count`` grows from n to n+1 only about 1/(n+1) of the sensors move.
"""

from __future__ import annotations

import hashlib
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MAX_SHARDS", "ShardConfig", "shard_of"]

MAX_SHARDS = 4096
_MASK64 = (1 << 64) - 1
_LCG_MULTIPLIER = 2862933555777941757


def shard_of(sensor_id: str, count: int) -> int:
    """The shard in ``range(count)`` that owns ``sensor_id``."""
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count must be in 1..{MAX_SHARDS}, got {count}")
    key = int.from_bytes(hashlib.sha256(sensor_id.encode("utf-8")).digest()[:8], "big")
    bucket, candidate = -1, 0
    while candidate < count:
        bucket = candidate
        key = (key * _LCG_MULTIPLIER + 1) & _MASK64
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


class ShardConfig(BaseModel):
    """This gateway's shard: it calibrates the sensors with ``shard_of(id, count) == index``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="This gateway's shard, 0-based.")
    count: int = Field(
        ge=1, le=MAX_SHARDS, description="Number of shards (gateways) in the deployment."
    )

    @model_validator(mode="after")
    def _index_in_range(self) -> Self:
        if self.index >= self.count:
            raise ValueError(f"shard index {self.index} must be below count {self.count}")
        return self

    def owns(self, sensor_id: str) -> bool:
        return shard_of(sensor_id, self.count) == self.index
