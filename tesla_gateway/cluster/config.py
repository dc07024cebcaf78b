"""``[cluster]``: the NATS servers, the streams, the partitions and the timings of cluster mode.

Validated once at start, like every section; the extra (nats-py) is looked for, not imported, so
the daemon's imports stay light when the section is absent or present.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from tesla_gateway.password_file import read_password_file

__all__ = ["EXTRA_HINT", "MAX_PIN_TTL_S", "SUBJECT_TOKEN", "ClusterConfig", "gateway_id_problem"]

EXTRA_HINT = "pip install 'tesla-gateway[cluster]' (nats-py 2.16+, nats-server 2.11+)"
_NAME = r"^[A-Za-z0-9_-]{1,32}$"  # stream, bucket and consumer names: no '.', '*', '>'
_SUBJECT = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"  # a NATS subject prefix without wildcards
_TOPIC = re.compile(r"^[^#+/][^#+]*[^#+/]$|^[^#+/]$")
# A gateway's or a sensor's id in cluster mode: one NATS subject token (member.<id>,
# <subject>.<sensor>.raw) and a valid key: the shared sensor-id rule without '.'.
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_PIN_TTL_S = 120.0


def gateway_id_problem(gateway_id: str) -> str | None:
    """Why ``gateway_id`` cannot name a cluster member (None: it can). A dotted id would make
    ``member.<id>`` several subject tokens deep, listed by no member (its gateway sits idle)."""
    if SUBJECT_TOKEN.fullmatch(gateway_id):
        return None
    return (
        f"gateway_id = {gateway_id!r}: cluster mode needs a gateway_id of letters, digits, "
        "'_' and '-' only (no '.': the NATS subject member.<gateway_id> takes it as one level), "
        f"e.g. {re.sub(r'[^A-Za-z0-9_-]', '-', gateway_id)!r}"
    )


class ClusterConfig(BaseModel):
    """Cluster mode (docs/deployment.md, "Beyond one gateway"); omit the section for one gateway."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: list[str] = Field(
        min_length=1,
        description="NATS server URLs of the cluster, e.g. ['nats://10.0.0.1:4222', ...].",
    )
    user: str | None = Field(
        default=None,
        min_length=1,
        description="NATS user of the gateways (deploy/nats/users.conf: 'gateway').",
    )
    password: SecretStr | None = Field(
        default=None, description="Its password; password_file keeps it out of the config."
    )
    password_file: Path | None = Field(
        default=None, description="File whose first line is the password (e.g. a systemd secret)."
    )
    readings_stream: str = Field(
        default="TESLA_READINGS", pattern=_NAME, description="The stream of raw readings."
    )
    readings_subject: str = Field(
        default="sensors",
        pattern=_SUBJECT,
        description=(
            "Readings arrive on '<readings_subject>.<sensor>.raw' (MQTT 'sensors/<sensor>/raw' "
            "through nats-server's MQTT listener)."
        ),
    )
    partitions: int = Field(
        default=12,
        ge=1,
        le=1024,
        description=(
            "Partitions of the readings (the unit of ownership and failover); fixed for the "
            "stream's life. A few per gateway you may ever run."
        ),
    )
    replicas: int = Field(default=3, ge=1, le=5, description="Stream and bucket replicas (R).")
    retention_s: float = Field(
        default=8 * 3600.0,
        gt=0,
        description="How long readings stay in the stream: at least N x period plus a margin.",
    )
    calibrated_stream: str = Field(
        default="TESLA_CALIBRATED", pattern=_NAME, description="The stream of calibrated values."
    )
    calibrated_subject: str = Field(
        default="tesla.calibrated",
        pattern=_SUBJECT,
        description="Calibrated values go to '<calibrated_subject>.<sensor>.<feature>'.",
    )
    calibrated_topic_prefix: str = Field(
        default="tesla/cluster",
        description=(
            "MQTT prefix of the calibrated topics, the same on every gateway, so a sensor's "
            "topics do not move with its partition (replaces [publisher] topic_prefix)."
        ),
    )
    dedup_window_s: float = Field(
        default=3600.0,
        ge=10,
        description=(
            "How long the calibrated stream remembers a (sensor, feature, period) it has, so a "
            "period calibrated again after a takeover is stored once."
        ),
    )
    bucket: str = Field(
        default="tesla_cluster",
        pattern=_NAME,
        description="KV bucket of the members, the partition leases and the window snapshots.",
    )
    pin_ttl_s: float = Field(
        default=5.0,
        ge=1,
        le=MAX_PIN_TTL_S,
        description=(
            "A silent owner loses its partitions' pins (and its leases) after this long: the "
            "failover time, roughly."
        ),
    )
    snapshot_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between snapshots of each owned partition's windows into the bucket.",
    )
    fallback_replay_periods: int = Field(
        default=0,
        ge=0,
        description=(
            "Without a snapshot, a new owner replays this many periods of readings; 0: the "
            "longest model window (N x period) plus two periods."
        ),
    )
    max_kv_value_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        description="Snapshots larger than this go to the object store (the KV value limit).",
    )
    max_snapshot_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "The largest partition snapshot a gateway writes or reads (inflated size): a "
            "larger one is not written, and one read is refused as corrupt (a cold start)."
        ),
    )

    @model_validator(mode="after")
    def _usable(self) -> Self:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give either password or password_file, not both")
        if (self.password is not None or self.password_file is not None) and self.user is None:
            raise ValueError("a password needs a user")
        if any("@" in server for server in self.servers):
            raise ValueError(
                "servers: put no credentials in a URL (they would be logged and shown): "
                "use user and password_file"
            )
        if not _TOPIC.fullmatch(self.calibrated_topic_prefix):
            raise ValueError(
                f"calibrated_topic_prefix = {self.calibrated_topic_prefix!r}: an MQTT topic "
                "without wildcards or a leading/trailing '/'"
            )
        if self.readings_stream == self.calibrated_stream:
            raise ValueError("readings_stream and calibrated_stream must differ")
        if importlib.util.find_spec("nats") is None:
            raise ValueError(f"[cluster] needs the 'cluster' extra: {EXTRA_HINT}")
        return self

    def credentials(self) -> tuple[str | None, str | None]:
        """``user`` and password for nats-py, reading ``password_file`` at each connect (so a
        rotated password is picked up by the next start)."""
        if self.user is None:
            return None, None
        password = self.password.get_secret_value() if self.password is not None else None
        if self.password_file is not None:
            password = read_password_file(self.password_file, "[cluster] password_file")
        return self.user, password

    @property
    def pin_ttl_ns(self) -> int:
        return int(self.pin_ttl_s * 1e9)
