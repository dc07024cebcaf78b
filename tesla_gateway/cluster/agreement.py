"""The settings every member of a cluster must share, recorded once in the bucket and compared
by each gateway as it joins.

Members that differ lose periods without an error: another model window makes a snapshot's
slot unreadable to the next owner, another pin TTL makes a failover wait for the longest, other
subjects or partitions split a stream nobody reads whole. So the first member records its
settings under ``config`` (a create: one wins), and a member whose settings differ refuses to
start, naming each difference, while any other member runs. With none running, the record is
replaced by compare-and-set (that is how a shared setting changes: stop every gateway, change
it, start them). Two gateways replacing it in the same instant: each checks the record again
every heartbeat, and the one whose settings are no longer recorded stops with the same error.
A model's version is no shared setting (an OTA rollout runs two at once), its geometry is.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from tesla_gateway.cluster.config import ClusterConfig
from tesla_gateway.cluster.engine import Engine
from tesla_gateway.cluster.errors import ClusterError, SettingsMismatchError
from tesla_gateway.contract.geometry import WindowGeometry

__all__ = ["SETTINGS_KEY", "Agreement", "differences", "shared_settings"]

SETTINGS_KEY = "config"
_ATTEMPTS = 8
_log = structlog.get_logger(__name__)
_HOUR_OFFSET = "hour_utc_offset_s"
_SHARED = (
    "partitions",
    "readings_stream",
    "readings_subject",
    "calibrated_stream",
    "calibrated_subject",
    "calibrated_topic_prefix",
    "pin_ttl_s",
)


def shared_settings(
    config: ClusterConfig,
    geometries: Mapping[str, WindowGeometry],
    hour_offsets: Mapping[str, int | None] | None = None,
) -> dict[str, Any]:
    """What every member must have alike: the ``[cluster]`` keys above and, per model slot,
    the window geometry its snapshots are made of (and, for a model that reads the hour of
    the day, the UTC offset its hour is taken in: the gateways' ``timezone``)."""
    settings: dict[str, Any] = {key: getattr(config, key) for key in _SHARED}
    settings["models"] = {
        slot: _model_settings(geometry, (hour_offsets or {}).get(slot))
        for slot, geometry in sorted(geometries.items())
    }
    return settings


def _model_settings(geometry: WindowGeometry, hour_offset: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "window_length": geometry.window_length,
        "period_seconds": geometry.period_seconds,
        "channels": list(geometry.read_channels),  # what snapshots hold; the hour is derived
    }
    if geometry.hour_positions is not None:
        entry[_HOUR_OFFSET] = hour_offset
    return entry


def differences(mine: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[str]:
    """``key: <mine> here, <recorded> in the cluster`` per differing setting; a model slot only
    one side has is none (a model missing until OTA brings it has no windows to disagree)."""
    found = [
        f"{key}: {mine.get(key)!r} here, {recorded.get(key)!r} in the cluster"
        for key in _SHARED
        if mine.get(key) != recorded.get(key)
    ]
    theirs = recorded.get("models")
    theirs = theirs if isinstance(theirs, dict) else {}
    for slot, geometry in sorted(mine.get("models", {}).items()):
        other = theirs.get(slot)
        if not isinstance(other, dict):
            continue
        found.extend(
            f"models.{slot}.{field}: {value!r} here, {other.get(field)!r} in the cluster"
            for field, value in geometry.items()
            # the hour's zone counts where both read the hour (a release may be rolling out)
            if other.get(field) != value and (field != _HOUR_OFFSET or field in other)
        )
    return found


def _with_new_slots(mine: Mapping[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The record with this member's model slots it lacks added (so later members agree on
    them too)."""
    models = dict(recorded.get("models") or {})
    for slot, geometry in mine.get("models", {}).items():
        models.setdefault(slot, geometry)
    return {**recorded, "models": models}


class Agreement:
    """This member's settings against the cluster's record (``config`` in the bucket)."""

    def __init__(
        self,
        engine: Engine,
        me: str,
        settings: dict[str, Any],
        others: Callable[[], Awaitable[list[str]]],
    ) -> None:
        self._engine = engine
        self._me = me
        self._settings = settings
        self._others = others  # the live members, maybe this one among them

    async def join(self) -> None:
        """Before the first heartbeat: record the settings, or find them recorded alike;
        :class:`SettingsMismatchError` when they differ while another member runs (a record
        no gateway wrote is replaced)."""
        from nats.js.errors import KeyWrongLastSequenceError

        for _ in range(_ATTEMPTS):
            revision, recorded = await self._read()
            try:
                if revision is None:
                    await self._engine.kv.create(SETTINGS_KEY, self._encode(self._settings))
                    return
                found: list[str] = []
                if recorded is not None:
                    found = differences(self._settings, recorded)
                    if not found:
                        wanted = _with_new_slots(self._settings, recorded)
                        if wanted != recorded:
                            await self._engine.kv.update(
                                SETTINGS_KEY, self._encode(wanted), last=revision
                            )
                        return
                    running = [m for m in await self._others() if m != self._me]
                    if running:
                        raise self._refusal(found, running)
                await self._engine.kv.update(
                    SETTINGS_KEY, self._encode(self._settings), last=revision
                )
                _log.warning(
                    "cluster_settings_replaced",
                    differences=found or ["the record was unreadable"],
                    why="no other member runs: this gateway's settings are the cluster's now",
                )
                return
            except KeyWrongLastSequenceError:  # another member wrote it meanwhile: again
                continue
        raise ClusterError(f"{SETTINGS_KEY}: the record kept changing under {_ATTEMPTS} joins")

    async def verify(self) -> None:
        """Every heartbeat: :class:`SettingsMismatchError` if the record differs from this
        member's settings (another gateway replaced it while this one was joining)."""
        revision, recorded = await self._read()
        if revision is None or recorded is None:
            return  # deleted by hand: the next member to join records its own
        found = differences(self._settings, recorded)
        if found:
            raise self._refusal(found, [m for m in await self._others() if m != self._me])

    async def _read(self) -> tuple[int | None, dict[str, Any] | None]:
        """(revision, record); (None, None) when there is none; (revision, None) when it is
        not a record any gateway wrote (replaced like a differing one)."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self._engine.kv.get(SETTINGS_KEY)
        except KeyNotFoundError:
            return None, None
        try:
            recorded = json.loads(entry.value or b"")
        except (ValueError, RecursionError):
            recorded = None
        if not isinstance(recorded, dict):
            _log.warning("cluster_settings_unreadable", key=SETTINGS_KEY)
            recorded = None
        return int(entry.revision or 0), recorded

    @staticmethod
    def _encode(settings: Mapping[str, Any]) -> bytes:
        return json.dumps(settings, sort_keys=True).encode()

    def _refusal(self, found: list[str], running: list[str]) -> SettingsMismatchError:
        bucket = self._engine.subjects.config.bucket
        return SettingsMismatchError(
            f"this gateway's settings differ from those the cluster runs with (key "
            f"{SETTINGS_KEY} of bucket {bucket}; members running: {', '.join(running) or '?'}): "
            f"{'; '.join(found)}. Every gateway of a cluster needs the same [cluster] "
            "partitions, subjects, streams, calibrated_topic_prefix and pin_ttl_s, and the same "
            "window length, period and channels per model: set this gateway's to the "
            "cluster's, or stop every gateway and start them with the new ones"
        )
